"""A controller's start: saved state is restored as one unit even when storage fails in the middle,
calls that depend on it wait for it, and a second live cluster with the same name refuses to start.
The real ``Controller`` class with fake agents, without Ray; S3 is moto's real server, stopped and
started during the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path

import pytest

from actors.controller import startup
from actors.controller.actor import Controller
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.saved.name_lease import LeaseRecord
from orchestrator.build import build_id
from orchestrator.errors import ClusterNameInUseError, RestoringError
from orchestrator.layout import lease_record_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.settings import UPLOAD_RETRIES_ENV_VAR
from orchestrator.storage import open_storage
from tests.support.fake_agents import (
    FakeAgent,
    fast_config,
    make_controller,
    no_postprocess,
    run,
    start_agents,
    status_when,
    until,
    wait_terminal,
    worker_info,
)
from tests.support.local_recorder import LocalRecorders
from tests.support.stepped_runner import ManualClock

TARGETS = ("run", "other")
# Slow training: a window of WINDOW steps stays CAPTURING for 25 s, and its ranks answer a cancel.
SLOW_STEP_S = 0.5
WINDOW = 50


def capturing(status) -> bool:
    return status.state == ProfileState.CAPTURING


async def restored(controller: Controller, profile_id: str, timeout_s: float):
    """The profile's status once the controller answers for it (it restores in the background)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        with contextlib.suppress(RestoringError):
            return await controller.get(profile_id)
        if loop.time() > deadline:
            raise AssertionError(f"{profile_id} not restored within {timeout_s}s")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("failing_step", ["watches", "second profile"])
def test_an_s3_outage_in_the_middle_of_restore_strands_no_profile(restartable_s3, monkeypatch, failing_step):
    # One attempt per storage call: an outage fails a restore at once instead of after ~7 s of backoff.
    monkeypatch.setenv(UPLOAD_RETRIES_ENV_VAR, "1")
    monkeypatch.setattr(startup, "RESTORE_RETRY_S", 0.2)
    home = StorageSpec(
        uri=f"s3://{restartable_s3.bucket}/restore-{uuid.uuid4().hex[:8]}", s3_endpoint_url=restartable_s3.endpoint_url
    )

    async def go():
        first = make_controller(home)
        agents = [FakeAgent(first, worker_info(0, 1, target=t), step_s=SLOW_STEP_S) for t in TARGETS]
        for a in agents:
            await a.start()
        ids = [(await first.submit(ProfileRequest(target=t, steps=WINDOW, timeout_s=60))).id for t in TARGETS]
        for profile_id in ids:
            assert capturing(await status_when(first, profile_id, capturing, timeout_s=10))
        await first.create_watch(WatchSpec(target="run", stalled=True, action="stacks"))

        # The actor restarts (the old one dies: none of its work goes on); storage goes away while the
        # new one is part-way through reading its state.
        for task in list(first._tasks):
            task.cancel()
        second = make_controller(home)
        persistence = second._persistence
        if failing_step == "watches":
            read_watches = persistence.load_watches
            watch_reads: list[None] = []

            async def load_watches():
                watch_reads.append(None)
                if len(watch_reads) == 1:
                    restartable_s3.stop()
                return await read_watches()

            monkeypatch.setattr(persistence, "load_watches", load_watches)
        else:
            read_profile = persistence.load_profile
            reads: list[str] = []

            async def load_profile(profile_id: str):
                reads.append(profile_id)
                if len(reads) == 2:
                    restartable_s3.stop()
                return await read_profile(profile_id)

            monkeypatch.setattr(persistence, "load_profile", load_profile)
        for a in agents:
            a.controller = second
        with pytest.raises(RestoringError, match="not restored its saved state"):
            await second.get(ids[0])
        restartable_s3.start()

        ended = []
        for profile_id in ids:
            assert capturing(await restored(second, profile_id, timeout_s=20))
            await second.cancel(profile_id)
            status, _ = await wait_terminal(second, profile_id, timeout_s=15)
            await second.delete(profile_id)
            ended.append(status.state)
        watches = await second.list_watches()
        left = (await second.list()).total
        for a in agents:
            await a.stop()
        return ended, watches, left

    ended, watches, left = run(go(), timeout_s=90)
    # Every profile loaded before the outage was resumed: cancel ended it and delete removed it.
    assert ended == [ProfileState.CANCELLED, ProfileState.CANCELLED]
    assert left == 0
    assert [w.spec.target for w in watches] == ["run"]


def test_config_waits_for_restore_and_names_the_configured_storage(home, tmp_path):
    elsewhere = StorageSpec(uri=str(tmp_path / "elsewhere"))

    async def go():
        first = make_controller(home)
        await first.configure(elsewhere)
        # A restarted controller's first call is config(): it must not answer with the constructor's storage.
        return await make_controller(home).config()

    assert run(go()).storage == elsewhere


# ---- two live clusters, one name --------------------------------------------------


def named(home: StorageSpec, ray_cluster: str, clock: Clock = SYSTEM_CLOCK, **overrides) -> Controller:
    """A controller named ``shared`` in the Ray cluster ``ray_cluster``, on ``clock``."""
    config = fast_config(home, cluster_name="shared", **overrides)
    return Controller(config, postprocess=no_postprocess, cluster=ray_cluster, clock=clock, recorder=LocalRecorders())


def saved_state(home: StorageSpec, profile_id: str) -> str:
    path = Path(home.uri.removeprefix("file://")) / "_rayprof" / "shared" / "profiles" / f"{profile_id}.json"
    return json.loads(path.read_text())["state"]


def test_a_second_live_cluster_with_the_same_name_refuses_to_start_and_adopts_nothing(home):
    timeout_s = 4.0

    async def go():
        a = named(home, "ray-a")
        agents = await start_agents(a, 1, step_s=0.05)
        submitted = await a.submit(ProfileRequest(target="run", steps=20, timeout_s=timeout_s))
        assert capturing(await status_when(a, submitted.id, capturing, timeout_s=10))
        b_clock = ManualClock()
        b = named(home, "ray-b", b_clock)
        with pytest.raises(ClusterNameInUseError) as refused:
            await b.ping()
        with pytest.raises(ClusterNameInUseError):
            await b.list()
        status, _ = await wait_terminal(a, submitted.id)
        assert await until(lambda: saved_state(home, submitted.id) in ("DONE", "FAILED"), timeout_s=10)
        # Had b adopted the profile, its ranks (which never call b) would time out there and b would
        # save it FAILED over a's DONE: b's clock passes the timeout and each profile b holds is stepped.
        b_clock.advance(timeout_s + 0.5)
        for profile in list(b._catalog.live.values()):
            await b._runner.step(profile)
        saved = saved_state(home, submitted.id)
        await agents[0].stop()
        return str(refused.value), status, saved

    message, status, saved = run(go())
    assert "'shared' is in use" in message and "(ray-a)" in message
    assert "RAYPROF_CLUSTER_NAME=another-name" in message and "RAYPROF_CLUSTER_NAME_LEASE_S" in message
    assert status.state == ProfileState.DONE
    assert saved == "DONE"


def test_a_name_is_free_again_once_its_holder_stops_renewing(home, monkeypatch):
    monkeypatch.setattr(startup, "RESTORE_RETRY_S", 0.05)

    async def go():
        a = named(home, "ray-a", cluster_name_lease_s=0.6)
        await a.ping()
        # b times how long a's renewals stand still on its own clock, which the test moves.
        clock = ManualClock()
        b = named(home, "ray-b", clock, cluster_name_lease_s=0.6)
        # a renews (a round of its every-0.2 s renewal) within each 0.4 s of b's clock: b stays refused
        # past a whole lease.
        refused = []
        for _ in range(3):
            with pytest.raises(ClusterNameInUseError):
                await b.ping()
            refused.append(True)
            await a._lease.acquire(0.6)
            clock.advance(0.4)
        for task in list(a._tasks):  # a's cluster is gone: nothing renews its lease
            task.cancel()

        async def b_serves() -> bool:
            with contextlib.suppress(ClusterNameInUseError):
                return await b.ping() == build_id()
            return False

        # b's clock moves on; b retries its start on real time (RESTORE_RETRY_S), so each try waits a turn of it.
        started = False
        for _ in range(60):
            if started := await b_serves():
                break
            clock.advance(0.05)
            await asyncio.sleep(0.05)
        return refused, started, (await b.list()).total

    refused, started, total = run(go())
    assert refused == [True, True, True]
    assert started
    assert total == 0


def test_a_restart_in_the_same_ray_cluster_takes_the_name_at_once(home):
    async def go():
        first = named(home, "ray-a")
        agents = await start_agents(first, 1)
        done, _ = await wait_terminal(first, (await first.submit(ProfileRequest(target="run", steps=3))).id)
        second = named(home, "ray-a")  # the same Ray cluster: its controller restarted
        found = await second.get(done.id)
        await agents[0].stop()
        return done, found

    done, found = run(go())
    assert found.state == done.state == ProfileState.DONE


def test_a_controller_that_finds_another_cluster_holding_its_name_at_renewal_stops_serving(home):
    async def go():
        a = named(home, "ray-a", cluster_name_lease_s=0.3)
        await a.ping()
        # Another cluster took the name over (it saw a's renewals stand still, say while a's storage was away).
        theirs = LeaseRecord(owner="ray-z", generation=10**6, renewed_at=utcnow())
        open_storage(home).put_state(theirs.model_dump_json().encode(), lease_record_key("shared", 10**6))

        async def refused() -> bool:
            try:
                await a.list()
            except ClusterNameInUseError:
                return True
            return False

        for _ in range(40):
            if await refused():
                return True
            await asyncio.sleep(0.05)
        return False

    assert run(go())
