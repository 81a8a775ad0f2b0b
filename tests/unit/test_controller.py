"""The control actor's state machine, driven without Ray: the real ``Controller`` class,
fake agents on one event loop, and real storage in a temp folder."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.controller.profiles.state import Profile
from orchestrator.errors import ConflictError, IllegalTransitionError
from orchestrator.layout import manifest_key
from orchestrator.manifest import read_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.storage import open_storage
from tests.support.fake_agents import make_controller as controller
from tests.support.fake_agents import run, start_agents, status_when, until, wait_terminal, worker_info
from tests.support.stepped_runner import ManualClock, Stepped


def request(steps: int = 10, **options) -> ProfileRequest:
    return ProfileRequest(target="run", steps=steps, **options)


def test_a_profile_goes_through_every_state_to_done_and_writes_its_manifest(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        submitted = await c.submit(request(steps=20))
        status, seen = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return status, seen, agents

    status, seen, agents = run(go())
    assert status.state == ProfileState.DONE
    assert [s for s in seen if s in (ProfileState.CAPTURING, ProfileState.COLLECTING)] == [
        ProfileState.CAPTURING,
        ProfileState.COLLECTING,
    ]
    assert {a.windows[0].start_step for a in agents} == {status.start_step}
    manifest = read_manifest(open_storage(home), "run", status.id)
    assert [(r.rank, r.state) for r in manifest.ranks] == [(0, RankState.DONE), (1, RankState.DONE)]
    assert manifest.cluster["nodes"] == 2


def test_a_stepped_profile_moves_only_when_its_runner_steps(home):
    async def go():
        c = controller(home)
        stepped = Stepped(c)
        agents = await start_agents(c, 2)
        submitted = await c.submit(request(steps=2))
        states = [(await c.get(submitted.id)).state]
        states.append((await stepped.step(submitted.id), (await c.get(submitted.id)).state))
        await until(lambda: all(a.window_task for a in agents), timeout_s=30)
        await asyncio.gather(*(a.window_task for a in agents))  # both ranks DONE
        states.append((await c.get(submitted.id)).state)  # nothing moved it
        states.append((await stepped.step(submitted.id), (await c.get(submitted.id)).state))
        for a in agents:
            await a.stop()
        return submitted.id, states

    profile_id, states = run(go())
    assert states == [
        ProfileState.PENDING,
        (False, ProfileState.SCHEDULED),
        ProfileState.SCHEDULED,
        (True, ProfileState.DONE),
    ]
    manifest = read_manifest(open_storage(home), "run", profile_id)
    assert [(r.rank, r.state) for r in manifest.ranks] == [(0, RankState.DONE), (1, RankState.DONE)]


def test_a_rank_that_fails_makes_the_profile_partial_with_its_reason(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        agents[1].behaviour = "fail"
        status, _ = await wait_terminal(c, (await c.submit(request())).id)
        for a in agents:
            await a.stop()
        return status

    status = run(go())
    assert status.state == ProfileState.PARTIAL
    assert "ranks [1] did not complete" in status.reason
    assert status.ranks[1].reason == "export failed: planted"


def ranks_are(*states: RankState):
    return lambda status: [r.state for r in status.ranks] == list(states)


def test_a_rank_that_never_reports_is_failed_at_the_timeout(home):
    async def go():
        clock = ManualClock()
        c = controller(home, clock, worker_expiry_grace_s=60.0)  # jumps past the timeout drop no agent
        stepped = Stepped(c)
        agents = await start_agents(c, 2)
        agents[0].behaviour = "hang"
        submitted = await c.submit(request(timeout_s=1.0))
        await stepped.step(submitted.id)  # scheduled and armed
        await status_when(c, submitted.id, ranks_are(RankState.CAPTURING, RankState.DONE), timeout_s=10)
        clock.advance(1.0)  # the timeout passes
        assert await stepped.step(submitted.id)
        status = await c.get(submitted.id)
        for a in agents:
            await a.stop()
        return status

    status = run(go())
    assert status.state == ProfileState.PARTIAL
    assert status.ranks[0].state == RankState.FAILED
    assert "no result within the 1s timeout (last state CAPTURING)" in status.ranks[0].reason


def test_a_rank_still_waiting_for_its_start_at_the_timeout_is_told_to_drop_the_window(home):
    # A rank far behind the leader (an uncoupled straggler) holds the window until it reaches
    # the start step; holding it, it would refuse every later window on that rank.
    async def go():
        clock = ManualClock()
        c = controller(home, clock, worker_expiry_grace_s=60.0)  # jumps past the timeout drop no agent
        stepped = Stepped(c)
        agents = await start_agents(c, 2)
        agents[1].training = False
        submitted = await c.submit(request(timeout_s=1.0))
        await stepped.step(submitted.id)  # scheduled and armed
        await status_when(c, submitted.id, ranks_are(RankState.DONE, RankState.ARMED), timeout_s=10)
        clock.advance(1.0)  # the timeout passes
        assert await stepped.step(submitted.id)
        status = await c.get(submitted.id)
        told = await until(lambda: submitted.id in agents[1].cancelled, timeout_s=30)
        for a in agents:
            await a.stop()
        return status, told

    status, told = run(go())
    assert status.state == ProfileState.PARTIAL
    assert "last state ARMED" in status.ranks[1].reason
    assert told


def _rank_1_vanishes(home, world_size: int, **controller_args):
    """The status of a profile in whose window rank 1 stops calling (its agent vanishes once armed)."""

    async def go():
        c = controller(home, **controller_args)
        agents = await start_agents(c, world_size)
        agents[1].behaviour = "vanish"
        status, _ = await wait_terminal(c, (await c.submit(request())).id)
        for a in agents:
            await a.stop()
        return status

    return run(go())


def test_a_worker_that_vanishes_mid_window_is_failed_with_a_reason(home):
    status = _rank_1_vanishes(home, 2)
    assert status.ranks[1].state == RankState.FAILED
    assert "worker stopped responding" in status.ranks[1].reason
    # Rank 1 was alone on host1 (tests/support/fake_agents.py): nothing answers from that host any more.
    assert "host host1 stopped answering: no heartbeat from it for over" in status.ranks[1].reason


def test_a_worker_that_vanishes_while_its_host_still_answers_is_said_to_have_exited(home):
    status = _rank_1_vanishes(home, 4)  # ranks 1 and 3 on host1
    assert [r.state for r in status.ranks] == [RankState.DONE, RankState.FAILED, RankState.DONE, RankState.DONE]
    assert "other workers on host host1 still answer: its process exited or hung" in status.ranks[1].reason


def test_a_worker_whose_actor_ray_killed_is_said_ended_by_ray_not_cut_off_with_its_host(home):
    # A run that ends has Ray Train kill its workers: every worker of a host goes silent at once, which alone reads
    # as a host or network down. Ray's GCS knows better, and says so in its own words.
    killed = "The actor is dead because it was killed by `ray.kill`."
    asked: list[list[str]] = []

    def gcs(actor_ids: list[str]) -> dict[str, str]:
        asked.append(actor_ids)
        return {a: killed for a in actor_ids if a == worker_info(1, 2).actor_id}

    status = _rank_1_vanishes(home, 2, actor_deaths=gcs)
    assert status.ranks[1].state == RankState.FAILED
    assert status.ranks[1].reason == (
        "worker stopped responding during the window: Ray holds its actor dead (The actor is dead because it was killed "
        "by `ray.kill`); Ray Train ends a run's workers so when the run finishes, fails or is stopped"
    )
    assert any(worker_info(1, 2).actor_id in ids for ids in asked)  # Ray was asked about the worker it dropped


def test_without_a_connected_ray_no_actor_is_said_dead():
    from actors.controller.agents.agent_side import deaths_in_ray

    assert deaths_in_ray(["a" * 32, "b" * 32]) == {}


@pytest.mark.parametrize("when", [RankState.ARMED, RankState.CAPTURING])
def test_cancel_ends_the_profile_cancelled_and_tells_every_armed_rank(home, when):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        submitted = await c.submit(request(steps=40, warmup=5))
        await status_when(
            c, submitted.id, lambda s: bool(s.ranks) and all(r.state == when for r in s.ranks), timeout_s=2, interval_s=0.005
        )
        await c.cancel(submitted.id)
        status, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return status, agents

    status, agents = run(go())
    assert status.state == ProfileState.CANCELLED
    assert all(status.id in a.cancelled for a in agents)
    assert {r.state for r in status.ranks} == {RankState.CANCELLED}


def test_cancel_after_the_arm_was_sent_but_before_it_was_acknowledged_tells_the_rank(home):
    async def go():
        c = controller(home)
        stepped = Stepped(c)
        gate = asyncio.Event()
        agents = await start_agents(c, 2, arm_ack_gate=gate)
        submitted = await c.submit(request(steps=40, warmup=5))
        assert not await stepped.step(submitted.id)  # the arms are sent
        await until(lambda: all(a.windows for a in agents), timeout_s=30)  # and reached the agents
        waiting = {r.rank for r in (await c.get(submitted.id)).ranks if r.state == RankState.WAITING}
        await c.cancel(submitted.id)
        gate.set()
        stepped.release(submitted.id)
        status, _ = await wait_terminal(c, submitted.id)
        await until(lambda: all(a.window_task is None or a.window_task.done() for a in agents), timeout_s=30)
        for a in agents:
            await a.stop()
        return status, agents, waiting

    status, agents, waiting = run(go())
    assert waiting == {0, 1}
    assert status.state == ProfileState.CANCELLED
    assert all(status.id in a.cancelled for a in agents)
    # Ended by the rank dropping its window, not marked as if the arm had never gone out.
    assert all(status.ranks[a.info.world_rank].reason != "cancelled before the window was armed" for a in agents)


def test_a_rank_that_reports_a_window_of_an_ended_profile_is_told_to_drop_it(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        status, _ = await wait_terminal(c, (await c.submit(request(steps=2))).id)
        stray = agents[0].windows[-1]
        await agents[0].report(stray, RankState.ARMED)
        await until(lambda: stray.profile_id in agents[0].cancelled, timeout_s=30)
        for a in agents:
            await a.stop()
        return status, agents

    status, agents = run(go())
    assert status.state == ProfileState.DONE
    assert status.id in agents[0].cancelled
    assert status.id not in agents[1].cancelled


def test_the_next_window_like_one_over_the_byte_cap_is_planned_shorter(home):
    async def go():
        c = controller(home, max_trace_bytes=10_000)
        agents = await start_agents(c, 2, trace_bytes=8_000)
        first, _ = await wait_terminal(c, (await c.submit(request(steps=4))).id)
        second, _ = await wait_terminal(c, (await c.submit(request(steps=4))).id)
        for a in agents:
            await a.stop()
        return first, second

    first, second = run(go())
    assert first.stop_step - first.start_step == 4
    # 8,000 bytes over 4 steps = 2,000 per step; 90% of 10,000 fits 4 steps... so plan 4.
    assert second.stop_step - second.start_step == 4
    assert second.state == ProfileState.DONE


def test_a_window_whose_like_predecessor_passed_the_cap_is_shortened_and_partial(home):
    async def go():
        c = controller(home, max_trace_bytes=10_000)
        agents = await start_agents(c, 1, trace_bytes=40_000)
        await wait_terminal(c, (await c.submit(request(steps=4))).id)
        second, _ = await wait_terminal(c, (await c.submit(request(steps=4))).id)
        for a in agents:
            await a.stop()
        return second

    second = run(go())
    assert second.stop_step - second.start_step == 1
    assert second.state == ProfileState.PARTIAL
    assert "window shortened from 4 to 1 steps" in second.reason


def test_an_illegal_transition_raises():
    profile = Profile(id="p", request=request(), storage=StorageSpec(uri="file:///x"), storage_uri="file:///x/run/p")
    profile.transition(ProfileState.FAILED)
    with pytest.raises(IllegalTransitionError, match="cannot go from FAILED to SCHEDULED"):
        profile.transition(ProfileState.SCHEDULED)


def test_a_second_request_on_a_busy_target_is_a_conflict(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        await c.submit(request(steps=30))
        try:
            with pytest.raises(ConflictError, match="already running"):
                await c.submit(request())
        finally:
            for a in agents:
                await a.stop()

    run(go())


def test_a_manifest_is_never_replaced(home):
    from orchestrator.errors import AlreadyExistsError

    storage = open_storage(home)
    storage.put_bytes(b"{}", manifest_key("run", "p1"), "manifest", if_absent=True)
    with pytest.raises(AlreadyExistsError):
        storage.put_bytes(b"{}", manifest_key("run", "p1"), "manifest", if_absent=True)


def test_two_live_runs_with_one_name_are_listed_side_by_side_without_evicting_each_other(home):
    async def go():
        c = controller(home)
        assert await c.register(worker_info(0, 1, job="job1"))
        assert await c.register(worker_info(0, 1, job="job2"))
        return await c.targets()

    targets = run(go())
    assert sorted((t.name, t.run) for t in targets) == [("run", "job1"), ("run", "job2")]


def test_an_agent_replaced_on_its_rank_is_told_to_stop_instead_of_evicting_its_replacement(home):
    async def go():
        c = controller(home)
        first = worker_info(0, 1, agent="old")
        second = worker_info(0, 1, agent="new")
        await c.register(first)
        await c.register(second)
        again = await c.register(first)
        return again, await c.targets()

    again, targets = run(go())
    assert again is None
    assert [r.info.agent_id for r in targets[0].ranks] == ["new"]


def test_finished_profiles_past_the_retention_count_are_deleted_from_storage(home):
    async def go():
        c = controller(home, retention_count=2)
        agents = await start_agents(c, 1)
        ids = []
        for _ in range(3):
            status, _ = await wait_terminal(c, (await c.submit(request(steps=2))).id)
            ids.append(status.id)
        for a in agents:
            await a.stop()
        for _ in range(100):  # expiry runs once the third profile has released its target
            if (await c.list()).total == 2:
                break
            await asyncio.sleep(0.01)
        return ids, await c.list()

    ids, page = run(go())
    assert [p.id for p in page.profiles] == [ids[2], ids[1]]
    assert not open_storage(home).exists(manifest_key("run", ids[0]))
    assert open_storage(home).exists(manifest_key("run", ids[2]))


def test_deleting_a_running_profile_is_a_conflict_and_a_finished_one_is_removed(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        done, _ = await wait_terminal(c, (await c.submit(request(steps=2))).id)
        running = await c.submit(request(steps=40))
        with pytest.raises(ConflictError, match="cancel it before deleting"):
            await c.delete(running.id)
        await c.delete(done.id)
        await c.cancel(running.id)
        for a in agents:
            await a.stop()
        return done, await c.list()

    done, page = run(go())
    assert done.id not in [p.id for p in page.profiles]
    assert not open_storage(StorageSpec(uri=done.storage_uri.rsplit("/run/", 1)[0])).list(f"run/{done.id}/")


def test_a_ranks_times_are_its_own_clock_but_never_later_than_when_the_controller_heard_them(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        agents[0].clock_offset_s = -0.25  # the arm reached it 0.25 s before its ARMED was heard
        agents[1].clock_offset_s = 3600.0  # a clock an hour ahead
        status, _ = await wait_terminal(c, (await c.submit(request(steps=2))).id)
        for a in agents:
            await a.stop()
        return status, utcnow()

    status, ended = run(go())
    assert status.state == ProfileState.DONE
    behind, ahead = status.ranks[0].armed_at, status.ranks[1].armed_at
    assert behind is not None and ahead is not None
    # Both arms were heard within milliseconds; rank 0's clock puts its arm 0.25 s earlier.
    assert ahead - behind >= timedelta(seconds=0.2)
    assert status.scheduled_at <= ahead <= ended
    # The same for the moment each rank opened the window (one step for both).
    opened = [r.capture_started_at for r in status.ranks]
    assert opened[1] - opened[0] >= timedelta(seconds=0.2) and opened[1] <= ended
    assert status.capture_started_at == opened[0]
