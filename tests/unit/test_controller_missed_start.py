"""A window whose arm reached every rank too late is armed again once; the real ``Controller``
class with fake agents, without Ray."""

from __future__ import annotations

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.fake_agents import make_controller as controller
from tests.support.fake_agents import run, start_agents, until, wait_terminal


def profile_with(home: StorageSpec, behaviours: list[str]):
    """One 3-step profile on one fake agent per behaviour; its final status and the agents."""

    async def go():
        c = controller(home)
        agents = await start_agents(c, len(behaviours))
        for agent, behaviour in zip(agents, behaviours, strict=True):
            agent.behaviour = behaviour
        status, _ = await wait_terminal(c, (await c.submit(ProfileRequest(target="run", steps=3))).id)
        for a in agents:
            await a.stop()
        return status, agents

    return run(go())


def test_a_window_every_rank_missed_is_armed_again_and_ends_done(home):
    status, agents = profile_with(home, ["late_arm", "late_arm"])

    assert status.state == ProfileState.DONE, status.reason
    assert [len(a.windows) for a in agents] == [2, 2]
    first, again = agents[0].windows
    assert again.start_step > first.start_step
    assert status.start_step == again.start_step
    assert all(a.windows[1] == again for a in agents)
    assert [r.missed_start for r in status.ranks] == [False, False]


def test_a_window_armed_again_starts_after_the_missed_start_even_when_no_step_count_moved(home):
    # The ranks said they were past the start; their step counts (a stale heartbeat, a sync that
    # timed out) may not show it yet. Frozen counts here: the new start still comes after the old.
    async def go():
        c = controller(home)
        agents = await start_agents(c, 2, behaviour="late_arm", training=False)
        profile_id = (await c.submit(ProfileRequest(target="run", steps=3))).id
        armed_twice = await until(lambda: all(len(a.windows) == 2 for a in agents), timeout_s=20)
        await c.cancel(profile_id)
        await wait_terminal(c, profile_id, timeout_s=20)
        for a in agents:
            await a.stop()
        return armed_twice, agents

    armed_twice, agents = run(go(), timeout_s=60)
    assert armed_twice
    first, again = agents[0].windows
    assert again.start_step > first.start_step
    assert agents[1].windows == [first, again]


def test_a_window_missed_again_ends_failed_saying_the_start_had_passed(home):
    status, agents = profile_with(home, ["always_late", "always_late"])

    assert status.state == ProfileState.FAILED
    assert "had passed" in status.reason
    assert [len(a.windows) for a in agents] == [2, 2]
    assert all(r.state == RankState.FAILED and r.missed_start for r in status.ranks)


def test_a_window_only_some_ranks_missed_is_not_armed_again(home):
    status, agents = profile_with(home, ["late_arm", "ok"])

    assert status.state == ProfileState.PARTIAL
    assert [len(a.windows) for a in agents] == [1, 1]
    assert [r.missed_start for r in status.ranks] == [True, False]
