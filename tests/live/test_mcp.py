"""The MCP server without a cluster: its tool list, input validation, size caps, error mapping.

Driven through the SDK's own client in process (``mcp.Client(server)``); the live
paths (stdio against the test cluster, HTTP against the service) are in test_mcp_live.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, ClientSession, StdioServerParameters, stdio_client

from orchestrator.analysis import analyze_folder
from orchestrator.errors import (
    ConflictError,
    ControllerUnavailableError,
    StorageError,
    TargetNotFoundError,
)
from orchestrator.mcp import build_server
from orchestrator.mcp.bounds import MAX_ANSWER_BYTES, cap, public_uri, rounded
from orchestrator.mcp.convert import _short, analysis_of, history_result
from orchestrator.mcp.resources import manifest_json, report_text
from orchestrator.mcp.results import HistoryResult, RankNow, TargetBrief, TargetList
from orchestrator.mcp.tool_errors import tool_error
from orchestrator.mcp.tools import ACTING_TOOLS
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import WatchSpec, WatchStatus
from orchestrator.models.history import RankSeries, TargetHistory
from orchestrator.models.profile import Artifact, Manifest, ProfileStatus, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.settings import TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from tests.support.common import RAYPROF_CLI
from tests.support.serve_fixtures import free_port
from tests.support.tracefiles import case


class _Untouched:
    """A client source that fails the test if a tool reaches it: input validation must refuse first."""

    calls = 0

    def __call__(self) -> Any:
        _Untouched.calls += 1
        raise AssertionError("a tool reached the client with arguments it should have refused")


def _run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


def test_acting_tools_are_annotated_and_read_only_leaves_them_out():
    async def tools(read_only: bool) -> dict[str, Any]:
        async with Client(build_server(_Untouched(), read_only=read_only)) as c:
            return {t.name: t for t in (await c.list_tools()).tools}

    every = _run(lambda: tools(False))
    assert set(ACTING_TOOLS) <= set(every)
    for name, tool in every.items():
        acts = name in ACTING_TOOLS
        assert tool.annotations.read_only_hint is (not acts), name
        assert tool.output_schema is not None, f"{name} has no typed result"
        assert tool.description.startswith("ACTS on") is acts, name
    assert every["delete_watch"].annotations.destructive_hint is True
    assert every["profile"].annotations.destructive_hint is False

    read_only = _run(lambda: tools(True))
    assert set(read_only) == set(every) - set(ACTING_TOOLS)


# Arguments the schemas refuse: bad names (path tricks, spaces, empty), out-of-range numbers, wrong types.
_BAD_NAME = st.one_of(
    st.sampled_from(["", "../etc", "a/b", "a b", "-x", "..", "a..b", "x" * 300]),
    st.text(min_size=1, max_size=20).filter(lambda s: not s.replace("-", "").replace("_", "").isalnum()),
)
_BAD_CALLS = st.one_of(
    st.builds(lambda n: ("get_profile", {"profile_id": n}), _BAD_NAME),
    st.builds(lambda n: ("diff", {"a": n, "b": "p1"}), _BAD_NAME),
    st.builds(lambda n: ("take_stacks", {"target": n}), _BAD_NAME),
    st.builds(lambda s: ("profile", {"request": {"target": "run", "steps": s}}), st.integers(max_value=0)),
    st.builds(lambda n: ("profile", {"request": {"target": n, "steps": 1}}), _BAD_NAME),
    st.builds(
        lambda k: ("profile", {"request": {"target": "run", "steps": 1, k: True}}),
        st.text(min_size=1, max_size=10).filter(lambda k: k not in ("queue", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")),
    ),
    st.builds(lambda s: ("history", {"target": "run", "span_s": s}), st.one_of(st.floats(max_value=0), st.floats(min_value=86401, allow_infinity=False))),
    st.builds(lambda p: ("history", {"target": "run", "max_points": p}), st.one_of(st.integers(max_value=1), st.integers(min_value=241))),
    st.builds(lambda w: ("get_profile", {"profile_id": "p1", "wait_timeout_s": w}), st.floats(min_value=901, allow_infinity=False)),
    st.builds(lambda x: ("list_profiles", {"limit": x}), st.one_of(st.integers(max_value=0), st.integers(min_value=51))),
    st.builds(lambda v: ("create_watch", {"watch": {"target": "run", "slower_than": v}}), st.floats(max_value=1.0)),
    st.builds(lambda a: ("get_findings", a), st.dictionaries(st.sampled_from(["profile_id", "x"]), st.integers(), min_size=1)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=_BAD_CALLS)
def test_invalid_tool_arguments_are_tool_errors_that_never_reach_the_client(call):
    name, arguments = call
    _Untouched.calls = 0

    async def go() -> Any:
        async with Client(build_server(_Untouched())) as c:
            return await c.call_tool(name, arguments)

    result = _run(go)
    assert result.is_error, (name, arguments, result)
    assert _Untouched.calls == 0
    assert "validation error" in result.content[0].text


def test_an_answer_over_the_cap_keeps_its_head_and_says_what_was_cut():
    target = TargetBrief(
        name="run", run=None, world_size=4096, health="TRAINING", stalled_s=None, median_step_time_ms=1.0,
        lagging_ranks=list(range(4096)), active_profile=None, queued_profiles=[], stall_stacks=None,
        stall_verdict=None,
        ranks=[RankNow(rank=r, step=10, step_time_ms=1.0) for r in range(4096)],
    )
    capped = cap(TargetList(targets=[target]))
    size = len(capped.model_dump_json())
    assert size <= MAX_ANSWER_BYTES
    assert capped.targets[0].lagging_ranks[:3] == [0, 1, 2]
    assert "targets[0].lagging_ranks" in capped.truncated and "of 4096" in capped.truncated
    with pytest.raises(TypeError, match="no `truncated` field"):
        cap(RankNow(rank=0, step=1, step_time_ms=None))
    small = TargetList(targets=[])
    assert cap(small) == small and cap(small).truncated is None


def test_the_history_tool_answers_the_clients_points_per_rank():
    # Before: the tool's local name for the client's answer hid the function that caps it ("Error executing tool
    # history"), seen only by the live stdio test.
    class _History:
        def history(self, target: str, **_: Any) -> TargetHistory:
            series = [RankSeries(rank=r, t=[1.0, 2.0], step=[1, 2], step_time_s=[0.1, 0.2]) for r in range(2)]
            return TargetHistory(target=target, resolution_s=1.0, span_s=600.0, ranks=series)

    async def go() -> Any:
        async with Client(build_server(lambda: _History())) as c:
            return await c.call_tool("history", {"target": "run"})

    result = _run(go)
    assert not result.is_error, result.content[0].text
    assert [r["rank"] for r in result.structured_content["ranks"]] == [0, 1]


def test_history_is_downsampled_to_max_points_per_rank_and_capped():
    n = 3600
    series = [
        RankSeries(rank=r, t=[float(i) for i in range(n)], step=list(range(n)), step_time_s=[0.1 * (r + 1)] * n)
        for r in range(8)
    ]
    history = TargetHistory(target="run", run="job", resolution_s=1.0, span_s=3600.0, ranks=series)
    result = cap(history_result(history, max_points=60))
    assert isinstance(result, HistoryResult)
    assert [r.rank for r in result.ranks] == [7, 6, 5, 4, 3, 2, 1, 0]  # slowest first
    assert all(len(r.t) == 60 for r in result.ranks)
    assert result.resolution_s == 60.0 and result.ranks_total == 8
    assert result.ranks[0].step_time_ms[0] == pytest.approx(800.0)
    assert result.truncated is None and len(result.model_dump_json()) <= MAX_ANSWER_BYTES


@pytest.mark.parametrize(
    "uri, public",
    [
        ("s3://bucket/prefix/run/p1/manifest.json", "s3://bucket/prefix/run/p1/manifest.json"),
        ("http://AKIA:secret@minio:9000/b/k?X-Amz-Signature=abc", "http://minio:9000/b/k"),
        ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F&X-Amz-Signature=s", "https://b.s3.amazonaws.com/k"),
        ("/mnt/cluster/store/run/p1", "/mnt/cluster/store/run/p1"),
        ("http://[::1]:9000/b", "http://[::1]:9000/b"),
    ],
)
def test_locations_lose_credentials(uri, public):
    assert public_uri(uri) == public


def test_a_409_says_a_window_is_running_and_how_to_queue():
    text = str(tool_error(ConflictError("a window already runs on live-run", target="live-run")))
    assert text.startswith("[conflict] a window already runs on live-run")
    assert "queue=true" in text

    assert "list_targets" in str(tool_error(TargetNotFoundError("no live target 'x'")))
    assert "retry" in str(tool_error(ControllerUnavailableError("cannot reach the service at http://127.0.0.1:1")))


def test_a_server_fault_hides_its_message():
    text = str(tool_error(StorageError("botocore said: https://secret-endpoint/...")))
    assert "secret-endpoint" not in text and "[storage_error]" in text


def test_a_tool_error_reaches_the_client_as_an_error_result():
    def failing() -> Any:
        raise ConflictError("a window already runs on live-run")

    async def go() -> Any:
        async with Client(build_server(failing)) as c:
            return await c.call_tool("profile", {"request": {"target": "live-run", "steps": 2}})

    result = _run(go)
    assert result.is_error
    assert "[conflict]" in result.content[0].text and "queue=true" in result.content[0].text
    json.dumps(result.model_dump(mode="json"))


def _straggler_manifest() -> Manifest:
    """A manifest whose summary is the analysis of the straggler case's real traces."""
    return Manifest(
        profile_id="p1",
        target="job",
        status=ProfileState.DONE,
        request=ProfileRequest(target="job", steps=4),
        storage_uri="s3://bucket/store/job/p1",
        start_step=121,
        stop_step=125,
        ranks=[RankResult(rank=0, state=RankState.DONE), RankResult(rank=1, state=RankState.DONE)],
        artifacts=[
            Artifact(kind="report", key="report.html", uri="http://key:secret@minio:9000/b/k?X-Amz-Signature=s", bytes=1, sha256="0" * 64)
        ],
        requested_at=utcnow(),
        finished_at=utcnow(),
        cluster={"experiment_paths": ["s3://AKIA:secret@bucket/exp"]},
        summary=analyze_folder(case("straggler")).model_dump(mode="json"),
    )


def test_a_profiles_analysis_names_the_straggler_with_its_findings_largest_saving_first():
    # Failed before the fix: analysis_of asked the Summary for a `kind` only a stacks summary has.
    analysis = analysis_of(_straggler_manifest())
    assert analysis is not None and analysis.stragglers
    assert analysis.ranks[0].rank == analysis.stragglers[0].rank  # the slowest rank first
    savings = [f.max_saving_ms for f in analysis.findings]
    assert savings == sorted(savings, reverse=True)


def test_the_resources_are_compact_and_hold_no_credentials():
    manifest = _straggler_manifest()
    text = report_text(manifest, analysis_of(manifest))
    assert text.startswith("rayprof profile p1 of job: DONE") and "straggler: rank" in text
    assert len(text.encode()) <= MAX_ANSWER_BYTES
    data = manifest_json(manifest)
    assert "secret" not in data and "X-Amz" not in data and "http://minio:9000/b/k" in data
    assert len(data.encode()) <= MAX_ANSWER_BYTES + 200


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_rounding_keeps_three_decimals_or_three_significant_digits(x):
    r = rounded(x)
    assert r == pytest.approx(x, rel=5e-3, abs=5e-4)
    assert len(repr(r)) <= max(len(repr(round(x))) + 5, 10)


@pytest.mark.parametrize(
    "path, short",
    [
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", "threading.py"),
        ("/work/.venv/lib/python3.11/site-packages/ray/train/v2/_internal/util.py", "ray/train/v2/_internal/util.py"),
        ("/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", "torch/distributed/distributed_c10d.py"),
        ("/work/main/deploy/examples/train_job.py", "/work/main/deploy/examples/train_job.py"),
    ],
)
def test_stack_frames_of_installed_code_lose_the_install_prefix(path, short):
    assert _short(path) == short


def _env_without_token() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR)}


def test_rayprof_mcp_with_no_service_serves_its_tools_and_a_call_says_what_to_fix():
    # The console script over stdio, as an MCP client starts it: up before any service is asked.
    params = StdioServerParameters(
        command=RAYPROF_CLI, args=["mcp", "--url", f"http://127.0.0.1:{free_port()}"], env=_env_without_token()
    )

    async def go() -> tuple[set[str], Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            return names, await s.call_tool("list_targets", {})

    names, result = _run(go)
    assert set(ACTING_TOOLS) < names and "list_targets" in names
    assert result.is_error
    assert "[controller_unavailable] cannot reach the rayprof service" in result.content[0].text
    assert "rayprof serve" in result.content[0].text


def test_rayprof_mcp_refuses_an_empty_token_at_start():
    done = subprocess.run(
        [RAYPROF_CLI, "mcp"], env={**_env_without_token(), TOKEN_ENV_VAR: ""}, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 2 and "empty" in done.stderr


def test_rayprof_mcp_refuses_a_url_that_is_not_http_at_start():
    # Before: it served, and every tool call answered "cannot reach the rayprof service" (as if it were down).
    done = subprocess.run(
        [RAYPROF_CLI, "mcp", "--url", "localhost:8000"], env=_env_without_token(), capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 2 and "service URL 'localhost:8000' is not an http(s) URL" in done.stderr


class _Watches:
    """The three watch calls of a client, kept in a dict: what the watch tools send and answer."""

    def __init__(self) -> None:
        self.held: dict[str, WatchStatus] = {}

    def watch(self, target: str, **options: Any) -> WatchStatus:
        status = WatchStatus(id=f"w{len(self.held)}", spec=WatchSpec(target=target, **options), created_at=utcnow(), state="WAITING")
        self.held[status.id] = status
        return status

    def watches(self) -> list[WatchStatus]:
        return list(self.held.values())

    def delete_watch(self, watch_id: str) -> None:
        del self.held[watch_id]


def test_watch_tools_pass_the_spec_through_and_answer_typed():
    store = _Watches()

    async def go() -> list[Any]:
        async with Client(build_server(lambda: store)) as c:
            spec = {"target": "run", "slower_than": 1.3, "for_s": 60, "profile_steps": 3}
            return [
                await c.call_tool("create_watch", {"watch": spec}),
                await c.call_tool("list_watches", {}),
                await c.call_tool("delete_watch", {"watch_id": "w0"}),
            ]

    created, listed, left = _run(go)
    assert not created.is_error, created.content[0].text
    assert created.structured_content["watch"]["spec"]["slower_than"] == 1.3
    assert [w["id"] for w in listed.structured_content["watches"]] == ["w0"]
    assert left.structured_content["watches"] == [] and store.held == {}


class _OneWindow:
    """A client backend with one profile that is PENDING when submitted and DONE at the first wait."""

    def _status(self, state: ProfileState) -> ProfileStatus:
        return ProfileStatus(
            id="p1", target="run", state=state, storage_uri="file:///s/run/p1", created_at=utcnow(),
            request=ProfileRequest(target="run", steps=1), ranks=[RankResult(rank=0, state=RankState.DONE)],
            manifest_uri="file:///s/run/p1/manifest.json" if state.is_terminal else None,
        )

    def call(self, name: str, *args: Any) -> Any:
        return getattr(self, name)(*args)

    def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus:
        return self._status(ProfileState.PENDING)

    def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        return self._status(ProfileState.DONE)

    def manifest(self, profile_id: str) -> Manifest:
        return _straggler_manifest()


def test_a_waited_profile_sends_progress_notices_with_each_ranks_state():
    from orchestrator.client import ProfilingClient

    client = ProfilingClient(backend=_OneWindow())  # type: ignore[arg-type]

    async def go() -> tuple[Any, list[tuple[float, str | None]]]:
        notices: list[tuple[float, str | None]] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            notices.append((done, message))

        async with Client(build_server(lambda: client)) as c:
            result = await c.call_tool("profile", {"request": {"target": "run", "steps": 1}}, progress_callback=progress)
        return result, notices

    result, notices = _run(go)
    assert not result.is_error, result.content[0].text
    assert result.structured_content["state"] == "DONE"
    assert notices == [(1, "DONE: rank 0 DONE")]
