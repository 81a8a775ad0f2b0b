"""A rank whose worker is dropped while the runner saves a state change, driven without Ray: the real
``Controller`` class, fake agents, a stepped runner on a manual clock, and a save that drops the worker
while it runs (the reaper's turn, at the one moment it matters)."""

from __future__ import annotations

import asyncio

from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.fake_agents import make_controller as controller
from tests.support.fake_agents import run, start_agents, status_when, until
from tests.support.stepped_runner import ManualClock, Stepped

EXPIRED = "no heartbeat for over 1s while other workers on host host0 still answer: its process exited or hung"


def test_a_worker_dropped_during_a_save_at_the_timeout_fails_as_lost_and_is_told_to_drop_the_window(home):
    async def go():
        clock = ManualClock()
        c = controller(home, clock, worker_expiry_grace_s=60.0)  # only the save below drops a worker
        stepped = Stepped(c)
        agents = await start_agents(c, 2)
        lost = agents[0]
        lost.behaviour = "hang"  # captures, then never reports
        submitted = await c.submit(ProfileRequest(target="run", steps=10, timeout_s=1.0))
        await stepped.step(submitted.id)  # scheduled and armed
        ranks = await status_when(
            c, submitted.id, lambda s: [r.state for r in s.ranks] == [RankState.CAPTURING, RankState.DONE], timeout_s=10
        )
        assert [r.state for r in ranks.ranks] == [RankState.CAPTURING, RankState.DONE]
        poll = lost.poll_task  # its agent pauses: it calls again only when the test says
        assert poll is not None
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        saving = c._persistence.save

        async def save_while_the_worker_expires(profile):
            if profile.state == ProfileState.CAPTURING:  # the step's state-change save, after its lost-rank check
                c._registry.drop(lost.info.agent_id, EXPIRED)
            await saving(profile)

        c._persistence.save = save_while_the_worker_expires
        clock.advance(1.0)  # the timeout passes
        assert await stepped.step(submitted.id)
        status = await c.get(submitted.id)
        lost._tasks.append(asyncio.create_task(lost._poll()))  # the pause ends: it registers again
        told = await until(lambda: submitted.id in lost.cancelled, timeout_s=30)
        for a in agents:
            await a.stop()
        return status, told

    status, told = run(go())
    assert status.state == ProfileState.PARTIAL
    assert status.ranks[0].state == RankState.FAILED
    assert status.ranks[0].reason == f"worker stopped responding during the window: {EXPIRED}"
    assert told
