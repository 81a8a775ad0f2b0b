"""Watches left running are safe: checked when created, capped over a real hour, paused when their
action keeps failing, and never a cause for deleting a profile someone asked for.

The real ``Controller`` with fake agents, without Ray; the storage tests run on a real S3 server
(moto's) that is stopped and started again while watches fire.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from actors.controller.diagnosis.watch_record import WatchRecord
from actors.controller.diagnosis.watches import Watches
from actors.controller.saved.persistence import Finished, Persistence
from actors.controller.saved.retention import expired
from orchestrator.cli import output
from orchestrator.cli import stacks_commands as cli
from orchestrator.errors import InvalidRequestError, InvalidWatchError
from orchestrator.manifest import read_manifest, verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import WatchSpec, WatchStatus
from orchestrator.models.profile import Trigger
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import ProfileSummary
from orchestrator.service.security import rayprof_error_response
from orchestrator.settings import UPLOAD_RETRIES_ENV_VAR
from orchestrator.storage import open_storage
from tests.support.common import RAYPROF_CLI
from tests.support.fake_agents import MONITORED, STEP_S, make_controller, saved_watch
from tests.support.fake_agents import run as run_bounded
from tests.support.stepped_runner import ManualClock, SteppedMonitor


def run(coro):
    return run_bounded(coro, 90)


def controller(home: StorageSpec, **overrides):
    return make_controller(home, **{**MONITORED, **overrides})


def stepped(home: StorageSpec, clock: ManualClock | None = None, **overrides) -> SteppedMonitor:
    """A controller whose monitor the test ticks, on ``clock`` (a new one unless given)."""
    clock = clock or ManualClock()
    return SteppedMonitor(make_controller(home, clock, **{**MONITORED, **overrides}), clock)


def lagging(**overrides) -> WatchSpec:
    """A watch on rank 2 lagging, at the tightest settings allowed: it fires on every tick it may."""
    values = dict(target="run", rank_lag=3, for_s=0, action="stacks", cooldown_s=0, max_per_hour=60)
    values.update(overrides)
    return WatchSpec(**values)


async def stop_all(agents) -> None:
    for a in agents:
        await a.stop()


# ---- a real S3 server that can go away ----------------------------------------------------


class S3Outage:
    """moto's S3 server on a fixed port, stopped and started on demand; objects survive a stop
    (moto keeps them in this process), as they would on a real S3 that was unreachable for a while."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def s3_outage(monkeypatch) -> Iterator[tuple[S3Outage, StorageSpec]]:
    """A controller home on a restartable S3 server; one attempt per call, so an outage is a fast error."""
    import boto3

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.setenv(UPLOAD_RETRIES_ENV_VAR, "1")
    server = S3Outage()
    server.start()
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="watch-safety")
    try:
        yield server, StorageSpec(uri=f"s3://watch-safety/{uuid.uuid4().hex[:8]}", s3_endpoint_url=server.endpoint)
    finally:
        server.stop()


# ---- item 2: the hourly cap and the retention budgets -----------------------------------


def test_a_busy_watch_is_capped_over_the_hour_and_never_pushes_out_a_requested_profile(s3_outage):
    server, home = s3_outage

    async def go():
        m = stepped(home, retention_count=2, retention_auto_count=3, watch_max_failures=1000)
        c = m.c
        agents = await m.start_agents(3)
        asked = []
        for _ in range(2):
            asked.append(await m.until_terminal((await c.submit(ProfileRequest(target="run", steps=3))).id))
        agents[2].step_s = 3 * STEP_S
        watch = await c.create_watch(lagging(max_per_hour=25))
        # The store goes away in the middle of the firings and comes back.
        assert await m.tick_until(lambda: len(c._watches.get(watch.id).fired_at) >= 5, max_ticks=1000)
        server.stop()
        await m.tick_until(lambda: any(f.error for f in c._watches.get(watch.id).firings), max_ticks=1000)
        server.start()
        capped = await m.tick_until(lambda: c._watches.get(watch.id).state == "CAPPED", max_ticks=2000, real_s=40)
        # The last firing's bundle may still be ending, a delete the outage refused is retried from the
        # monitor tick (retention.RETRY_S), and so is the last firing's save, which the restart reads:
        # tick for all three, bounded, rather than a fixed time.
        for _ in range(150):
            page = await c.list()
            ended = len([p for p in page.profiles if p.trigger is not None]) <= 3
            saved = await saved_watch(home, watch.id)
            landed = saved is not None and saved.fired_at == c._watches.get(watch.id).fired_at
            if ended and landed and not c._retention.retry_due(float("inf")):
                break
            await m.tick(0.5)
            await asyncio.sleep(0.2)
        state = c._watches.get(watch.id)
        await stop_all(agents)
        page = await c.list()
        restarted = stepped(home, m.clock, retention_count=2, retention_auto_count=3)
        again = await restarted.start_agents(3)
        again[2].step_s = 3 * STEP_S
        await restarted.ticks(30)  # lagging all along after the restart
        watches = await restarted.c.list_watches()
        await stop_all(again)
        return asked, watch, capped, state, page, await restarted.c.list(), watches

    asked, watch, capped, state, page, after_restart, watches = run(go())
    assert capped and state.state == "CAPPED"
    assert len(state.fired_at) == 25
    assert sum(f.error is not None for f in state.firings) >= 1  # bundles taken while the store was away
    for listing in (page, after_restart):
        requested = [p for p in listing.profiles if p.trigger is None]
        automatic = [p for p in listing.profiles if p.trigger is not None]
        assert sorted(p.id for p in requested) == sorted(p.id for p in asked)
        assert len(automatic) <= 3 and all(p.trigger.watch_id == watch.id for p in automatic)
    storage = open_storage(home)
    for status in asked:
        manifest = read_manifest(storage, "run", status.id)
        assert manifest.status == ProfileState.DONE and verify_manifest(storage, manifest) == []
    # The firings of the last hour came back with the watch: still capped after the restart.
    assert [w.state for w in watches] == ["CAPPED"] and watches[0].fired_at == state.fired_at


def test_the_cap_counts_a_rolling_hour_beyond_the_last_20_firings(home):
    spec = lagging(max_per_hour=30)
    now = utcnow()
    watch = WatchRecord(id="w", spec=spec, created_at=now, fired=[now - timedelta(minutes=50 - i) for i in range(30)])
    aged = WatchRecord(id="w", spec=spec, created_at=now, fired=[now - timedelta(minutes=61)] + list(watch.fired)[1:])

    assert Watches._blocked(watch, now) == "CAPPED"
    assert Watches._blocked(aged, now) is None
    assert len(WatchRecord(id="w", spec=spec, created_at=now, fired=[now] * 100).fired) == 30


def _entry(n: int, trigger: Trigger | None) -> Finished:
    at = utcnow() - timedelta(minutes=100 - n)
    summary = ProfileSummary(
        id=f"p{n}", target="run", state=ProfileState.DONE, steps=1, storage_uri="file:///x",
        created_at=at, finished_at=at, trigger=trigger,
    )
    return Finished(summary=summary, storage=StorageSpec(uri="file:///x"))


def test_automatic_bundles_have_a_retention_budget_of_their_own():
    def trigger(watch_id: str | None) -> Trigger:
        return Trigger(kind="stalled", watch_id=watch_id, at=utcnow(), detail="planted")

    requested = [_entry(n, None) for n in range(3)]
    watched = [_entry(n, trigger("watch-1")) for n in range(3, 50)]
    stalled = [_entry(50, trigger(None))]

    due = {e.id for e in expired([*requested, *watched, *stalled], count=3, days=30, auto_count=5, now=utcnow())}

    assert not due & {e.id for e in requested}
    assert due == {e.id for e in watched[:-4]}  # the newest 5 automatic: the stall's and 4 watch bundles


# ---- item 3: a watch is checked when created, and a failing one stops ----------------------


@pytest.mark.parametrize(
    "spec, why",
    [
        (dict(rank_lag=3, profile_steps=51), "RAYPROF_MAX_STEPS"),
        (dict(stalled=True), "action='stacks'"),
        (dict(rank_lag=3, action="stacks", ranks="lagging"), "needs action='profile'"),
        (dict(slower_than=1.3, baseline_s=10), "baseline would never be ready"),
    ],
)
def test_a_watch_that_could_never_act_is_refused_with_422(home, spec, why):
    async def go():
        c = controller(home, monitor_interval_s=5.0)
        with pytest.raises(InvalidWatchError, match=why) as refused:
            await c.create_watch(WatchSpec(target="run", **spec))
        return refused.value, await c.list_watches()

    error, watches = run(go())
    assert watches == []
    assert rayprof_error_response(None, error).status_code == 422 and error.exit_status == 2


def test_a_watch_whose_action_keeps_failing_pauses_with_its_reason(s3_outage):
    server, home = s3_outage

    async def go():
        m = stepped(home, watch_max_failures=3)
        c = m.c
        agents = await m.start_agents(3)
        watch = await c.create_watch(lagging(action="profile", profile_steps=2))
        server.stop()
        agents[2].step_s = 3 * STEP_S
        paused = await m.tick_until(lambda: c._watches.get(watch.id).state == "PAUSED", max_ticks=1000)
        await m.ticks(20)  # paused: no more tries
        state = await c.get_watch(watch.id)
        server.start()
        saved = Persistence(home, "unit")
        landed = False
        for _ in range(100):  # the pause is saved once the store is back (retried from the tick)
            landed = [w.state for w in await saved.load_watches()] == ["PAUSED"]
            if landed:
                break
            await m.tick(1.0)
            await asyncio.sleep(0.1)
        await stop_all(agents)
        return paused, state, landed, await controller(home).list_watches()

    paused, state, landed, restored = run(go())
    assert paused and state.state == "PAUSED"
    assert [f.error is not None for f in state.firings] == [True, True, True]
    assert len(state.fired_at) == 3 and state.failures == 3
    assert "3 times in a row" in state.paused and "upload" in state.paused
    assert landed and restored[0].state == "PAUSED" and restored[0].paused == state.paused


def test_failed_firings_count_toward_the_cooldown(home):
    async def go():
        m = stepped(home, max_steps=2, watch_max_failures=100)
        c = m.c
        agents = await m.start_agents(3)
        watch = await c.create_watch(lagging(action="profile", profile_steps=2, cooldown_s=60))
        # Planted: the server's limit falls below the watch's steps after it was created.
        c._settings.update(max_steps=1)
        agents[2].step_s = 3 * STEP_S
        await m.tick_until(lambda: bool(c._watches.get(watch.id).firings), max_ticks=400)
        await m.ticks(20)
        state = await c.get_watch(watch.id)
        await stop_all(agents)
        return state

    state = run(go())
    assert len(state.firings) == 1 and "RAYPROF_MAX_STEPS" in state.firings[0].error
    assert state.state == "COOLDOWN"


def test_the_watch_listing_shows_why_a_watch_is_paused(monkeypatch):
    paused = WatchStatus(
        id="watch-1", spec=lagging(), created_at=utcnow(), state="PAUSED", failures=3,
        paused="its action failed 3 times in a row; last: upload failed",
    )

    class Client:
        def watches(self):
            return [paused]

    printed = io.StringIO()
    monkeypatch.setattr(cli, "_client", lambda args: Client())
    monkeypatch.setattr(output, "_results", printed)
    cli.watches(type("Args", (), {"json": False})())

    assert "watch-1 PAUSED: its action failed 3 times in a row; last: upload failed" in printed.getvalue()


# ---- item 9: the watch limit holds under concurrent creates --------------------------------


def test_concurrent_creates_never_pass_the_watch_limit(home):
    async def go():
        c = controller(home, max_watches=100)
        await c.ping()
        results = await asyncio.gather(*(c.create_watch(lagging()) for _ in range(300)), return_exceptions=True)
        return results, await c.list_watches()

    results, watches = run(go())
    refused = [r for r in results if isinstance(r, InvalidRequestError)]
    assert len(watches) == 100 and len(refused) == 200
    assert all("RAYPROF_MAX_WATCHES" in r.message for r in refused)


def test_the_cli_refuses_a_zero_step_profile_watch_before_any_request():
    # `--then-profile 0` was read as "not given" and became 5.
    refused = subprocess.run(
        [RAYPROF_CLI, "watch", "my-run", "--rank-lag", "2", "--then-profile", "0", "--url", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120, check=False,
    )

    assert refused.returncode == 2 and "profile_steps" in refused.stderr
