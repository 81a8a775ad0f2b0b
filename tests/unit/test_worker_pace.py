"""How fast a rank steps, as the controller plans a window's lead from it (``Worker.pace_s``): the faster of the
agent's own measure and the controller's heartbeats, so a lead is never counted in steps of a slow start."""

from __future__ import annotations

import pytest

from actors.controller.agents.registry import Worker
from actors.controller.profiles.planning import start_step
from orchestrator.models.requests import ProfileRequest
from orchestrator.settings import MIN_LEAD_STEPS
from tests.support.fake_agents import FakeAgent, run, start_agents, until, wait_terminal, worker_info
from tests.support.fake_agents import make_controller as controller


def worker(step_time_s: float | None, *samples: tuple[float, int]) -> Worker:
    w = Worker(info=worker_info(0, 2), registered_at=0.0, secret="s", seen_at=0.0, step_time_s=step_time_s)
    w.samples.extend(samples)
    return w


def test_heartbeats_give_the_pace_where_the_agent_measured_none() -> None:
    # An agent measures its step time over a second: in its first second it reports none.
    assert worker(None, (10.0, 0), (10.2, 40)).pace_s() == pytest.approx(0.005)


def test_the_faster_of_the_agents_measure_and_the_heartbeats_is_the_pace() -> None:
    # The agent's second was the slow start (imports, a first compile); its heartbeats now show 15 ms a step.
    assert worker(0.25, (10.0, 0), (10.3, 20)).pace_s() == pytest.approx(0.015)
    assert worker(0.01, (10.0, 0), (10.3, 20)).pace_s() == 0.01


def test_heartbeats_without_progress_leave_the_agents_measure() -> None:
    assert worker(0.1, (10.0, 5), (12.0, 5)).pace_s() == 0.1
    assert worker(None, (10.0, 5)).pace_s() is None


def test_a_lead_from_the_heartbeats_pace_covers_the_arm_time() -> None:
    # The Accelerate job of the extended live tests: 15 ms a step, no step time reported yet. Before: a lead of
    # MIN_LEAD_STEPS (3 steps, 45 ms) against a 0.3 s arm lead, and one rank missed its start.
    pace = worker(None, (10.0, 0), (10.6, 40)).pace_s()
    assert pace is not None
    assert start_step(40, [pace], 0.01, 0.3, 0) >= 40 + 20
    assert start_step(40, [], 0.01, 0.3, 0) == 40 + 3


def test_a_window_on_ranks_that_report_no_step_time_leads_by_their_heartbeats_pace(home) -> None:
    # Ranks stepping every millisecond or so whose heartbeats carry no step time; a 0.2 s arm lead. Before: a lead
    # of 3 steps, passed long before the arm lands.
    async def go() -> FakeAgent:
        c = controller(home, arm_lead_s=0.2)
        agents = await start_agents(c, 2, reports_step_time=False, step_s=0.001)
        assert await until(lambda: all(len(w.samples) >= 2 for w in c._registry.workers.values()), timeout_s=20)
        profile_id = (await c.submit(ProfileRequest(target="run", steps=3))).id
        assert await until(lambda: all(a.windows for a in agents), timeout_s=20)
        await c.cancel(profile_id)
        await wait_terminal(c, profile_id, timeout_s=20)
        for a in agents:
            await a.stop()
        return agents[0]

    agent = run(go(), timeout_s=60)
    # 0.2 s at the event loop's pace (a few ms a step, even under load) is tens of steps.
    assert agent.windows[0].start_step - agent.armed_at_steps[0] > MIN_LEAD_STEPS
