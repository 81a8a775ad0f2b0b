"""``rayprof mcp`` as an agent's MCP client runs it: the SDK's ClientSession over stdio, spawning the
console script against the session's cluster; and the service's ``/mcp`` over streamable HTTP.

One stdio session does what an agent asked "why is my run slow?" would: list the targets, profile
a run with a planted straggler to DONE and name the slow rank and why, meet a 409 and queue, read
the findings and the report, diff two profiles, read the history, take the stacks of the planted
hang, and add, list and remove a watch. Each call and its answer is printed (``-s``; written to
``$RAYPROF_MCP_TRANSCRIPT`` when set): the transcript the README quotes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from orchestrator.cli.example_job import ExampleJob
from orchestrator.mcp.bounds import MAX_ANSWER_BYTES
from tests.support.common import LIVE_TARGET, RAYPROF_CLI, REPO, wait_for
from tests.support.serve_fixtures import TOKEN

pytest_plugins = ["tests.support.serve_fixtures"]
pytestmark = pytest.mark.integration

SLOW_TARGET = "mcp-slow"
# Past the steps its profiles take (each 3 steps and an arming lead, one after another, the first
# ~60 steps in); at 0.2-0.4 s a step under this suite's load, the hang comes 30-50 s after start-up.
HANG_AT = 130


@pytest.fixture(scope="module")
def planted_job(ray_cluster, client, tmp_path_factory):
    """Rank 1 sleeps 0.15 s per step after its forward (a straggler the other rank waits for) and, at
    step 130, forever (a hang: rank 0 blocks in all_reduce). One job for both: a second would double
    the start-up on two cores."""
    log = tmp_path_factory.mktemp("mcp") / f"{SLOW_TARGET}.log"
    job = ExampleJob(
        ray_cluster, SLOW_TARGET, log, "--slow-rank", "1", "--slow-rank-delay-s", "0.15",
        "--hang-rank", "1", "--hang-at-step", str(HANG_AT), "--flight-recorder", "2000",
    )
    try:
        job.wait_until_training(client, min_step=2, timeout=300)
        yield job
    finally:
        job.stop(timeout=5)


def _names_rank_1(profile: dict[str, Any]) -> bool:
    analysis = profile["analysis"]
    return [s["rank"] for s in analysis["stragglers"]] == [1] and any(
        f["code"] == "straggler" and f["ranks"] == [1] for f in analysis["findings"]
    )


class Transcript:
    """Each tool call with its arguments, its answer's size and the answer; printed at the end."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.lines: list[str] = []

    async def call(
        self, name: str, arguments: dict[str, Any], *, error: bool = False, notices: list[str] | None = None
    ) -> dict[str, Any] | str:
        async def progress(done: float, total: float | None, message: str | None) -> None:
            assert notices is not None
            notices.append(f"{done:g}: {message}")

        callback = progress if notices is not None else None
        result = await self.session.call_tool(name, arguments, read_timeout_seconds=600, progress_callback=callback)
        text = result.content[0].text
        size = len(text.encode())
        self.lines.append(f"→ {name}({json.dumps(arguments)})\n← {size} bytes{' (error)' if result.is_error else ''}: {text}")
        assert result.is_error is error, text
        assert size <= MAX_ANSWER_BYTES, f"{name} answered {size} bytes"
        if error:
            return text
        assert result.structured_content is not None
        return result.structured_content


def _stdio(ray_cluster: str, *args: str) -> StdioServerParameters:
    # The whole environment: the session's RAYPROF_* settings and S3 credentials, as a user's shell has them.
    return StdioServerParameters(
        command=RAYPROF_CLI, args=["mcp", "--in-cluster", "--address", ray_cluster, *args], env=dict(os.environ), cwd=REPO
    )


def test_an_agent_finds_the_slow_rank_and_the_hung_one_over_stdio(ray_cluster, client, planted_job, tmp_path):
    errlog = (tmp_path / "mcp-server.log").open("w")

    async def session() -> list[str]:
        async with stdio_client(_stdio(ray_cluster), errlog=errlog) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            t = Transcript(s)
            targets = await t.call("list_targets", {})
            assert SLOW_TARGET in {x["name"] for x in targets["targets"]}
            slow = next(x for x in targets["targets"] if x["name"] == SLOW_TARGET)
            assert slow["world_size"] == 2 and len(slow["ranks"]) == 2

            # timeout_s: a window the hang overtook ends PARTIAL rather than waiting out the tool call.
            request = {"target": SLOW_TARGET, "steps": 3, "timeout_s": 60}
            first = await t.call("profile", {"request": request, "wait": False})
            assert first["state"] in ("PENDING", "SCHEDULED", "RUNNING", "COLLECTING") and "get_profile" in first["next"]
            busy = await t.call("profile", {"request": request}, error=True)
            assert "[conflict]" in busy and "queue=true" in busy
            notices: list[str] = []
            second = await t.call("profile", {"request": {**request, "queue": True}}, notices=notices)
            assert second["state"] == "DONE", second
            # The wait's progress: a notice per state it saw, each rank's state in words.
            assert notices and notices[0].startswith("1: ") and "rank 0" in notices[0], notices
            t.lines.append("  progress notices: " + " | ".join(notices))
            first = await t.call("get_profile", {"profile_id": first["id"], "wait": True})
            assert first["state"] == "DONE", first
            # Its ranks share two cores with the cluster's own processes: one window may miss the planted straggler, not three.
            windows = [first, second]
            if not any(_names_rank_1(w) for w in windows):
                windows.append(await t.call("profile", {"request": request}))
            named = next((w for w in windows if _names_rank_1(w)), None)
            assert named is not None, [w["analysis"] for w in windows]
            assert named["analysis"]["ranks"][0]["rank"] == 1  # the slowest rank first
            assert named["manifest_uri"] and named["manifest_resource"].endswith("/manifest")

            findings = await t.call("get_findings", {"profile_id": named["id"]})
            assert findings["stragglers"] == named["analysis"]["stragglers"]
            report = (await s.read_resource(named["report_resource"])).contents[0].text
            assert report.startswith(f"rayprof profile {named['id']} of {SLOW_TARGET}: DONE") and "straggler: rank 1" in report
            t.lines.append(f"→ read_resource({named['report_resource']})\n← {len(report.encode())} bytes: {report}")
            manifest = json.loads((await s.read_resource(named["manifest_resource"])).contents[0].text)
            assert manifest["profile_id"] == named["id"] and "secret" not in json.dumps(manifest).lower()

            diff = await t.call("diff", {"a": first["id"], "b": second["id"]})
            assert (diff["a"], diff["b"]) == (first["id"], second["id"])
            # Same request twice: only a window the profiler slowed (its caution) may keep them from comparing.
            assert all(why.startswith("the profiler slowed the steps of ") for why in diff["not_comparable"])
            assert diff["comparable"] == (diff["not_comparable"] == [])
            assert diff["step_time"]["verdict"] in ("decreased", "increased", "unchanged", "too_few_steps")
            history = await t.call("history", {"target": SLOW_TARGET, "span_s": 600, "max_points": 20})
            assert {r["rank"] for r in history["ranks"]} == {0, 1} and all(len(r["t"]) <= 20 for r in history["ranks"])

            wait_for(
                lambda: any(x.name == SLOW_TARGET and min(r.step for r in x.ranks) >= HANG_AT for x in client.targets()),
                timeout=300,
                what="the planted hang",
            )
            stacks = await t.call("take_stacks", {"target": SLOW_TARGET})
            assert stacks["verdict"].startswith("rank 1 is in train_job.py:") and "_planted_hang" in stacks["verdict"]
            assert "rank 0 waits in all_reduce" in stacks["verdict"]
            assert stacks["groups"][0]["ranks_text"] == "rank 1"

            spec = {"target": SLOW_TARGET, "stalled": True, "action": "stacks", "for_s": 3600}
            watch = (await t.call("create_watch", {"watch": spec}))["watch"]
            assert watch["spec"]["stalled"] and watch["state"] in ("WAITING", "HOLDING")
            assert watch["id"] in [w["id"] for w in (await t.call("list_watches", {}))["watches"]]
            left = await t.call("delete_watch", {"watch_id": watch["id"]})
            assert watch["id"] not in [w["id"] for w in left["watches"]]
            return t.lines

    started = time.monotonic()
    try:
        lines = anyio.run(session)
    finally:
        errlog.close()
        print("--- the server's stderr ---\n" + (tmp_path / "mcp-server.log").read_text()[-6000:])
    transcript = f"--- MCP transcript ({time.monotonic() - started:.0f} s) ---\n" + "\n".join(lines)
    print("\n" + transcript)
    if os.environ.get("RAYPROF_MCP_TRANSCRIPT"):
        Path(os.environ["RAYPROF_MCP_TRANSCRIPT"]).write_text(transcript)


def test_read_only_serves_no_acting_tool(ray_cluster):
    async def names() -> set[str]:
        async with stdio_client(_stdio(ray_cluster, "--read-only")) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return {tool.name for tool in (await s.list_tools()).tools}

    tools = anyio.run(names)
    assert "list_targets" in tools and not tools & {"profile", "take_stacks", "create_watch", "delete_watch"}


_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
_MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_the_service_serves_mcp_under_the_api_token_and_host_rules(service, live_job):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def targets(url: str, token: str | None) -> list[str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            result = await s.call_tool("list_targets", {})
            assert not result.is_error, result.content[0].text
            unknown = await s.call_tool("get_profile", {"profile_id": "prof-none"})
            assert unknown.is_error and "[profile_not_found]" in unknown.content[0].text
            assert "list_profiles" in unknown.content[0].text
            return [t["name"] for t in result.structured_content["targets"]]

    assert LIVE_TARGET in anyio.run(targets, f"{service.url}/mcp", None)
    assert LIVE_TARGET in anyio.run(targets, f"{service.secure_url}/mcp", TOKEN)

    with httpx.Client(timeout=30) as http:
        refused = http.post(f"{service.secure_url}/mcp", json=_INITIALIZE, headers=_MCP_HEADERS)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        wrong = http.post(
            f"{service.secure_url}/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, "Authorization": "Bearer " + "x" * 24}
        )
        assert wrong.status_code == 401
        rebound = http.post(f"{service.url}/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, "Host": "attacker.example"})
        assert rebound.status_code == 400 and "not allowed" in rebound.json()["detail"]
        cross_site = http.post(f"{service.url}/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, "Origin": "https://evil.example"})
        assert cross_site.status_code == 403
