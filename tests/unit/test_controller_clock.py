"""Every date and age the controller gives a profile, a stacks bundle or a submit key is read from its
injected clock, so a test that moves the clock controls them (issue 31, item 7)."""

from __future__ import annotations

from orchestrator.layout import id_created_at
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.fake_agents import make_controller, run, start_agents, wait_terminal
from tests.support.stepped_runner import ManualClock

DAY_S = 24 * 3600.0


def request(steps: int = 3) -> ProfileRequest:
    return ProfileRequest(target="run", steps=steps)


def test_a_submit_key_is_kept_for_a_day_of_the_controllers_wall_clock(home):
    async def go():
        clock = ManualClock()
        c = make_controller(home, clock)
        agents = await start_agents(c, 1)
        first = await c.submit(request(), "nightly")
        await wait_terminal(c, first.id)
        clock.forward(DAY_S - 60)
        within_the_day = await c.submit(request(), "nightly")
        clock.forward(120)
        after_the_day = await c.submit(request(), "nightly")
        await wait_terminal(c, after_the_day.id)
        for a in agents:
            await a.stop()
        return first, within_the_day, after_the_day

    first, within_the_day, after_the_day = run(go())
    assert within_the_day.id == first.id
    assert after_the_day.id != first.id


def test_a_profiles_dates_are_the_controllers_wall_clock(home):
    async def go():
        clock = ManualClock()
        clock.forward(DAY_S * 400)  # a wall clock far from the process's: a date from anywhere else shows
        c = make_controller(home, clock)
        agents = await start_agents(c, 2)
        submitted = await c.submit(request())
        done, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return clock, submitted, done

    clock, submitted, done = run(go())
    assert done.state == ProfileState.DONE
    assert id_created_at(submitted.id) == clock.at.replace(microsecond=0)
    assert done.created_at == done.scheduled_at == done.finished_at == clock.at


def test_a_stacks_bundle_is_dated_by_the_controllers_wall_clock(home):
    async def go():
        clock = ManualClock()
        clock.forward(DAY_S * 400)
        c = make_controller(home, clock)
        agents = await start_agents(c, 2)
        bundle = await c.stacks("run")
        for a in agents:
            await a.stop()
        return clock, bundle

    clock, bundle = run(go())
    assert bundle.state == ProfileState.DONE
    assert bundle.taken_at == bundle.finished_at == clock.at
    assert id_created_at(bundle.id) == clock.at.replace(microsecond=0)
