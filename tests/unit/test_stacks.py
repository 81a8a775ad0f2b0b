"""Stacks of every rank, without Ray: the agent's own snapshot, and the controller's fan-out,
grouping and storage driven by fake agents on one event loop."""

from __future__ import annotations

import json
import threading

import pytest

from actors.agent.thread_stacks import take_stacks
from actors.controller.diagnosis.stack_groups import ranks_text
from orchestrator.errors import TargetNotFoundError
from orchestrator.layout import STACKS_NAME, profile_uri
from orchestrator.manifest import read_manifest, verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import HOW_A_RUN_APPEARS
from orchestrator.models.diagnosis import Collective
from orchestrator.models.profile import StacksSummary
from orchestrator.models.requests import ProfileState, RankState
from orchestrator.storage import open_storage
from tests.support.fake_agents import SLOW_THING, run, start_agents
from tests.support.fake_agents import make_controller as controller


async def stacks_of(home: StorageSpec, world_size: int, plant, **overrides):
    # fast_config expires a worker 0.5 s after a missed poll: on a busy box one late fake agent turned a
    # bundle PARTIAL (CI rehearsal, 2026-12-01). These tests are about what the ranks answer, not expiry.
    c = controller(home, **{"worker_expiry_grace_s": 30.0, **overrides})
    agents = await start_agents(c, world_size)
    plant(agents)
    bundle = await c.stacks("run")
    page = await c.list()
    for a in agents:
        await a.stop()
    return bundle, page


def test_the_rank_unlike_the_majority_comes_first_and_the_rest_collapse_into_a_range(home):
    def plant(agents):
        agents[1].stack = list(SLOW_THING)

    bundle, _ = run(stacks_of(home, 8, plant))
    assert bundle.state == ProfileState.DONE
    assert bundle.summary == (
        "rank 1 is in train.py:57 in slow_thing; "
        "ranks 0, 2–7 wait in all_reduce (distributed_c10d.py:3245) from train.py:41 in train_loop"
    )
    assert [g.ranks for g in bundle.groups] == [[1], [0, 2, 3, 4, 5, 6, 7]]
    assert [g.majority for g in bundle.groups] == [False, True]


def test_on_a_tie_the_ranks_waiting_in_a_collective_are_the_majority(home):
    def plant(agents):
        agents[1].stack = list(SLOW_THING)

    bundle, _ = run(stacks_of(home, 2, plant))
    assert bundle.summary.startswith("rank 1 is in train.py:57 in slow_thing; rank 0 waits in all_reduce")


def test_a_bundle_is_stored_like_a_profile_with_its_manifest_last_and_listed_with_profiles(home):
    bundle, page = run(stacks_of(home, 2, lambda agents: None))
    storage = open_storage(home)
    manifest = read_manifest(storage, "run", bundle.id)
    assert manifest.kind == "stacks" and manifest.status == ProfileState.DONE
    assert verify_manifest(storage, manifest) == []
    assert sorted(a.key for a in manifest.all_artifacts()) == ["stacks.json", "stacks/rank0.txt", "stacks/rank1.txt"]
    stored = json.loads(storage.get_bytes(f"run/{bundle.id}/{STACKS_NAME}"))
    assert stored["summary"] == bundle.summary
    rank0 = storage.get_bytes(f"run/{bundle.id}/stacks/rank0.txt").decode()
    assert 'Thread 2 "train"  (training thread)' in rank0 and "dist.all_reduce(loss)" in rank0
    assert [(p.id, p.kind) for p in page.profiles] == [(bundle.id, "stacks")]


def test_a_bundles_manifest_holds_its_stacks_summary_and_its_folder_like_a_profiles(home):
    def plant(agents):
        agents[1].stack = list(SLOW_THING)

    bundle, _ = run(stacks_of(home, 3, plant))
    manifest = read_manifest(open_storage(home), "run", bundle.id)
    assert manifest.summary == StacksSummary(line=bundle.summary, groups=2, missing=[])
    assert manifest.storage_uri == bundle.storage_uri == profile_uri(home.uri, "run", bundle.id)


def test_a_bundle_asks_for_no_window_in_its_manifest_its_status_or_its_list_item(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        bundle = await c.stacks("run")
        status, page = await c.get(bundle.id), await c.list()
        for a in agents:
            await a.stop()
        return bundle, status, page

    bundle, status, page = run(go())
    assert read_manifest(open_storage(home), "run", bundle.id).request is None
    assert status.kind == "stacks" and status.request is None and status.target == "run"
    assert [(p.kind, p.steps) for p in page.profiles] == [("stacks", None)]


def test_a_rank_that_does_not_answer_is_listed_with_why_and_the_bundle_is_partial(home):
    def plant(agents):
        agents[2].stack = None

    bundle, page = run(stacks_of(home, 3, plant, stacks_timeout_s=0.5))
    assert bundle.state == ProfileState.PARTIAL
    assert [m.rank for m in bundle.missing] == [2]
    assert bundle.missing[0].reason.startswith("no answer within 0.5s")
    assert bundle.summary.endswith("rank 2 did not answer")
    assert page.profiles[0].rank_states == {RankState.DONE: 2, RankState.FAILED: 1}
    assert read_manifest(open_storage(home), "run", bundle.id).summary.missing == [2]


def test_the_flight_recorders_name_the_collective_a_rank_never_joined(home):
    def plant(agents):
        for a in agents:
            a.collectives = [Collective(process_group="default_pg", seq=s, op="gloo:all_reduce", completed=True) for s in range(1, 41)]
        agents[0].collectives.append(Collective(process_group="default_pg", seq=41, op="gloo:all_reduce", completed=False))
        agents[2].collectives.append(Collective(process_group="default_pg", seq=41, op="gloo:all_reduce", completed=False))

    bundle, _ = run(stacks_of(home, 3, plant))
    assert bundle.collectives == [
        "process group default_pg: collective #41 (gloo:all_reduce) was entered by ranks 0, 2; "
        "rank 1 never joined it (last entered: #40)"
    ]
    assert bundle.flight_recorder_note is None


def test_without_a_flight_recorder_the_bundle_says_so(home):
    bundle, _ = run(stacks_of(home, 2, lambda agents: None))
    assert bundle.collectives == []
    assert bundle.flight_recorder_note == "torch flight recorder is off"


def test_stacks_of_an_unknown_target_is_target_not_found(home):
    async def go():
        c = controller(home, poll_timeout_s=0.05)
        with pytest.raises(TargetNotFoundError) as missing:
            await c.stacks("nope")
        return missing.value

    error = run(go())
    # No run is live: the error says how one becomes a target (before: "known targets: none", no way forward).
    assert error.message == f"no live training run named 'nope'; known targets: none ({HOW_A_RUN_APPEARS})"


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([1], "rank 1"), ([0, 2, 3, 4, 5, 6, 7], "ranks 0, 2–7"), ([0, 1], "ranks 0, 1"), ([3, 5, 6], "ranks 3, 5, 6")],
)
def test_rank_ranges_read_like_prose(ranks, text):
    assert ranks_text(ranks) == text


def test_the_agent_sees_a_thread_blocked_outside_python_and_marks_the_training_thread():
    release = threading.Event()
    started = threading.Event()
    idents: list[int] = []

    def blocked_in_collective() -> None:
        idents.append(threading.get_ident())
        started.set()
        release.wait(30)

    worker = threading.Thread(target=blocked_in_collective, name="train-fn")
    worker.start()
    try:
        started.wait(10)
        stacks = take_stacks("stk-1", "agent", 40, idents[0], native=False)
    finally:
        release.set()
        worker.join(10)
    training = [t for t in stacks.threads if t.training]
    assert [t.name for t in training] == ["train-fn"]
    assert "blocked_in_collective" in [f.function for f in training[0].frames]
    assert not next(f for f in training[0].frames if f.function == "blocked_in_collective").library
    assert stacks.native is None and stacks.native_note is None
    assert stacks.flight_recorder_note == "no torch.distributed process group in this worker"


def test_native_frames_come_from_py_spy_or_say_why_not():
    stacks = take_stacks("stk-1", "agent", 0, threading.get_ident(), native=True)
    if stacks.native is not None:
        assert "Thread" in stacks.native
    else:
        assert stacks.native_note is not None and stacks.native_note.startswith("native frames not taken")
