"""OOM watches on the controller: every rank of the target records while the watch exists;
a rank's out-of-memory report takes one bundle with every rank's stacks and allocator
snapshot, the failing rank, what it asked for and what was free. Driven without Ray by fake
agents (tests/support/fake_agents.py) that answer as the agent's MemoryWatch does."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from orchestrator.cli import stacks_commands as cli
from orchestrator.cli.main import main
from orchestrator.manifest import read_manifest
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import WatchSpec, WatchStatus
from orchestrator.models.profile import Artifact
from orchestrator.storage import open_storage
from tests.support.fake_agents import MONITORED, FakeAgent, make_controller, start_agents, until, worker_info
from tests.support.fake_agents import run as run_bounded
from tests.support.inprocess_service import service_client

MiB = 2**20


def run(coro):
    return run_bounded(coro, 40)


def oom_watch(**overrides) -> WatchSpec:
    return WatchSpec(**{"target": "run", "oom": True, "action": "stacks", "cooldown_s": 600, **overrides})


def _controller(home):
    # No worker may expire while the fake agents share a loaded CI box's event loop: an expired
    # worker's stacks are missing from the bundle, which is what other tests are for.
    return make_controller(home, **MONITORED, worker_expiry_grace_s=60.0)


async def _watched(home, ranks: int):
    """A controller, ``ranks`` fake agents and an OOM watch on their target, once every rank records."""
    c = _controller(home)
    agents = await start_agents(c, ranks)
    watch = await c.create_watch(oom_watch())
    await until(lambda: all(a.recording for a in agents), timeout_s=10)
    return c, agents, watch


async def _stop(agents) -> None:
    for a in agents:
        await a.stop()


async def _fired(controller, watch_id: str, count: int = 1):
    for _ in range(400):
        state = await controller.get_watch(watch_id)
        if len(state.firings) >= count:
            return state
        await asyncio.sleep(0.025)
    return state


def test_every_rank_of_the_target_records_while_the_watch_exists(home):
    async def go():
        c = _controller(home)
        agents = await start_agents(c, 3)
        watch = await c.create_watch(oom_watch())
        recording = await until(lambda: all(a.recording for a in agents), timeout_s=10)
        await c.delete_watch(watch.id)
        stopped = await until(lambda: not any(a.recording for a in agents), timeout_s=10)
        await _stop(agents)
        return recording, stopped

    assert run(go()) == (True, True)


async def _notes_of_watches_on_a_cpu_run_and_a_cuda_run(home) -> tuple[str | None, str | None]:
    """Two runs, one on CPUs and one on CUDA devices, each with an OOM watch: their notes once the watches were
    advanced (the CPU run's note says so), or after the bound."""
    c = _controller(home)
    agents = [
        FakeAgent(c, worker_info(r, 2, target=target).model_copy(update={"device": device}))
        for target, device in (("cpu-run", "cpu"), ("gpu-run", "cuda:0"))
        for r in range(2)
    ]
    for a in agents:
        await a.start()
    cpu = await c.create_watch(oom_watch(target="cpu-run"))
    gpu = await c.create_watch(oom_watch(target="gpu-run"))
    await until(lambda: all(a.recording for a in agents if a.info.device.startswith("cuda")), timeout_s=10)
    for _ in range(400):
        if (await c.get_watch(cpu.id)).note is not None:
            break
        await asyncio.sleep(0.025)
    notes = (await c.get_watch(cpu.id)).note, (await c.get_watch(gpu.id)).note
    await _stop(agents)
    return notes


def test_an_oom_watch_says_so_on_a_run_without_cuda_and_not_on_a_cuda_run(home):
    on_cpu, on_cuda = run_bounded(_notes_of_watches_on_a_cpu_run_and_a_cuda_run(home))

    assert on_cpu is not None and on_cpu.startswith("no rank of this run has a CUDA device")
    assert on_cuda is None


def test_an_oom_takes_one_bundle_with_every_ranks_stacks_and_snapshot_and_names_the_failing_rank(home):
    async def go():
        c, agents, watch = await _watched(home, 3)
        await agents[1].oom(asked_bytes=2048 * MiB, free_bytes=300 * MiB)
        state = await _fired(c, watch.id)
        page = await c.list()
        await _stop(agents)
        return state, page

    state, page = run(go())
    bundle = page.profiles[0]
    assert [p.id for p in page.profiles] == [state.firings[0].profile_id]
    assert bundle.kind == "stacks" and bundle.trigger.kind == "oom"
    oom = bundle.trigger.oom
    assert (oom.rank, oom.asked_bytes, oom.free_bytes) == (1, 2048 * MiB, 300 * MiB)
    assert "rank 1 ran out of CUDA memory on cuda:0: asked for 2,048.0 MiB with 300.0 MiB free of 81,920.0 MiB" in bundle.trigger.detail
    manifest = read_manifest(open_storage(home), "run", bundle.id)
    for rank in manifest.ranks:
        kinds = {a.kind: a.key for a in rank.artifacts}
        assert kinds["memory_snapshot"] == f"memory/rank{rank.rank}.snapshot.pickle"
        assert kinds["memory_view"] == f"memory/rank{rank.rank}.snapshot.html"
    assert manifest.trigger.oom.rank == 1


def test_ooms_within_the_cooldown_take_no_second_bundle(home):
    async def go():
        c, agents, watch = await _watched(home, 2)
        await agents[0].oom(asked_bytes=MiB, free_bytes=0)
        await _fired(c, watch.id)
        await agents[1].oom(asked_bytes=MiB, free_bytes=0)
        c._watches.tick(time.monotonic())  # a tick after the report, stepped here: it would spawn the firing
        busy = c._watches._watches[watch.id].busy
        state = await c.get_watch(watch.id)
        await _stop(agents)
        return state, busy

    state, busy = run(go())
    assert len(state.firings) == 1 and state.state == "COOLDOWN" and not busy


def test_an_oom_of_a_target_without_an_oom_watch_takes_nothing(home):
    async def go():
        c = _controller(home)
        agents = await start_agents(c, 2)
        await agents[0].oom(asked_bytes=MiB, free_bytes=0)
        c._watches.tick(time.monotonic())
        page = await c.list()
        await _stop(agents)
        return page, [a.recording for a in agents]

    page, recording = run(go())
    assert page.profiles == [] and recording == [False, False]


def test_a_rank_that_lists_a_file_outside_its_place_gets_only_its_own_listed(home):
    async def go():
        c, agents, watch = await _watched(home, 2)
        stray = Artifact(kind="memory_snapshot", key="memory/rank0.snapshot.pickle", uri="file:///elsewhere", bytes=1, sha256="0" * 64)
        agents[1].extra_snapshot_files = [stray]
        await agents[1].oom(asked_bytes=MiB, free_bytes=0)
        state = await _fired(c, watch.id)
        await _stop(agents)
        return state

    state = run(go())
    assert state.firings[0].error is None, state.firings[0]
    manifest = read_manifest(open_storage(home), "run", state.firings[0].profile_id)
    rank1 = next(r for r in manifest.ranks if r.rank == 1)
    assert sorted(a.key for a in rank1.artifacts if a.kind.startswith("memory")) == [
        "memory/rank1.snapshot.html", "memory/rank1.snapshot.pickle"]


def test_a_rank_that_records_nothing_is_named_in_the_bundle_with_why(home):
    async def go():
        c, agents, watch = await _watched(home, 2)
        agents[0].recording = False  # e.g. a CPU rank
        await agents[1].oom(asked_bytes=MiB, free_bytes=0)
        state = await _fired(c, watch.id)
        await _stop(agents)
        return state

    state = run(go())
    stacks = open_storage(home).get_bytes(f"run/{state.firings[0].profile_id}/stacks.json")
    assert b'"memory_notes"' in stacks and b"records no allocator history" in stacks


def test_an_oom_watch_takes_stacks_and_says_so_when_asked_to_profile():
    with pytest.raises(ValidationError, match="set action='stacks'"):
        WatchSpec(target="run", oom=True)
    with pytest.raises(ValidationError, match="exactly one condition"):
        WatchSpec(target="run", oom=True, stalled=True, action="stacks")


def test_over_http_an_oom_watch_is_created_and_a_profiling_one_refused(home, monkeypatch):
    async def go():
        c = _controller(home)
        async with service_client(monkeypatch, c) as http:
            profiling = await http.post("/v1/watches", json={"target": "run", "oom": True})
            good = await http.post("/v1/watches", json={"target": "run", "oom": True, "action": "stacks"})
        return profiling, good

    profiling, good = run(go())
    assert profiling.status_code == 422 and "set action='stacks'" in profiling.json()["detail"]
    assert good.status_code == 201 and WatchStatus.model_validate(good.json()).spec.condition == "oom"


def test_the_cli_creates_an_oom_watch_both_ways_and_refuses_a_profile_action(monkeypatch, capsys):
    sent: list[WatchSpec] = []
    at = utcnow()

    class Client:
        def watch(self, target, **options):
            sent.append(WatchSpec(target=target, **options))
            return WatchStatus(id=f"watch-{len(sent)}", spec=sent[-1], created_at=at, state="WAITING")

    monkeypatch.setattr(cli, "_client", lambda args: Client())
    short = main(["oom-watch", "my-run", "--cooldown", "30m"])
    long = main(["watch", "my-run", "--oom"])
    text = capsys.readouterr().out
    refused = main(["watch", "my-run", "--oom", "--then-profile", "3"])

    assert (short, long, refused) == (0, 0, 2)
    assert [(s.oom, s.action) for s in sent] == [(True, "stacks"), (True, "stacks")]
    assert sent[0].cooldown_s == 1800
    assert "watch-1  watching my-run: when a rank runs out of CUDA memory" in text
    assert "leave out --then-profile" in capsys.readouterr().err
