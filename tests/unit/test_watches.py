"""Watches: a condition on a target's heartbeats that, held long enough, opens a window or takes stacks.
Driven without Ray by fake agents on one event loop. The controller's clock is the test's
(``ManualClock``): the test steps the monitor tick (``SteppedMonitor.tick``), so a hold or a cooldown
lasts as many ticks as it says; the fake agents train and answer on real time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.controller.actor import Controller
from orchestrator.errors import InvalidRequestError, WatchNotFoundError
from orchestrator.manifest import read_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.requests import ProfileState
from orchestrator.storage import open_storage
from tests.support.fake_agents import (
    MONITORED,
    STEP_S,
    make_controller,
    until_saved,
)
from tests.support.fake_agents import run as run_bounded
from tests.support.stepped_runner import ManualClock, SteppedMonitor


def run(coro):
    return run_bounded(coro, 40)


def controller(home: StorageSpec, **overrides) -> Controller:
    return make_controller(home, **{**MONITORED, **overrides})


def stepped(home: StorageSpec, **overrides) -> SteppedMonitor:
    """A controller on a clock of its own, ticked by the test."""
    clock = ManualClock()
    return SteppedMonitor(make_controller(home, clock, **{**MONITORED, **overrides}), clock)


def slowdown(**overrides) -> WatchSpec:
    values = dict(target="run", slower_than=1.3, for_s=0.3, profile_steps=5, baseline_s=10, cooldown_s=60)
    values.update(overrides)
    return WatchSpec(**values)


async def profiles(c: Controller):
    return [p for p in (await c.list()).profiles if p.kind == "profile"]


def test_a_slowdown_that_holds_takes_exactly_one_profile_with_its_trigger(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(2)
        watch = await c.create_watch(slowdown())
        await m.ticks(20)  # a baseline of 1 s
        before = await profiles(c)
        for a in agents:
            a.step_s = 1.5 * STEP_S
        slow_at = m.clock.monotonic()
        await m.tick_until(lambda: bool(c._watches.get(watch.id).firings), max_ticks=100)
        fired_after = m.clock.monotonic() - slow_at
        found = await profiles(c)
        status = await m.until_terminal(found[0].id)
        await m.ticks(20)  # slow all along, but in the cooldown
        after = await profiles(c)
        state = await c.get_watch(watch.id)
        for a in agents:
            await a.stop()
        return before, fired_after, status, after, state

    before, fired_after, status, after, state = run(go())
    assert before == []
    assert fired_after >= 0.3
    assert len(after) == 1
    trigger = status.trigger
    assert trigger.kind == "slower_than" and trigger.watch_id == state.id
    assert trigger.baseline == pytest.approx(STEP_S) and trigger.observed == pytest.approx(1.5 * STEP_S)
    assert trigger.threshold == pytest.approx(1.3 * STEP_S)
    assert status.state == ProfileState.DONE and status.stop_step - status.start_step == 5
    manifest = read_manifest(open_storage(home), "run", status.id)
    assert manifest.trigger == trigger
    assert state.state == "COOLDOWN" and [f.profile_id for f in state.firings] == [status.id]


def test_a_slowdown_shorter_than_its_duration_takes_nothing(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(2)
        await c.create_watch(slowdown(for_s=2.0))
        await m.ticks(20)
        for a in agents:
            a.step_s = 1.5 * STEP_S
        await m.ticks(16)  # slow for 0.8 s of the 2 s it must hold
        for a in agents:
            a.step_s = STEP_S
        await m.ticks(40)
        found = await profiles(c)
        for a in agents:
            await a.stop()
        return found

    assert run(go()) == []


def test_the_hourly_cap_stops_a_watch_without_cooldown(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(3)
        agents[2].step_s = 3 * STEP_S
        watch = await c.create_watch(
            WatchSpec(target="run", rank_lag=3, for_s=0.1, action="stacks", cooldown_s=0, max_per_hour=2)
        )
        await m.tick_until(lambda: c._watches.get(watch.id).state == "CAPPED", max_ticks=400)
        await m.ticks(10)
        page = await c.list()
        state = await c.get_watch(watch.id)
        for a in agents:
            await a.stop()
        return state, page

    state, page = run(go())
    assert state.state == "CAPPED"
    assert len(state.firings) == 2 and page.total == 2
    assert all(p.kind == "stacks" and p.trigger.kind == "rank_lag" for p in page.profiles)


def test_a_lag_watch_profiles_the_lagging_rank_plus_a_few_healthy_ones(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(6)
        agents[4].step_s = 3 * STEP_S
        watch = await c.create_watch(WatchSpec(target="run", rank_lag=3, for_s=0.1, ranks="lagging", profile_steps=2))
        await m.tick_until(lambda: bool(c._watches.get(watch.id).firings), max_ticks=400)
        found = await profiles(c)
        status = await c.get(found[0].id)
        for a in agents:
            await a.stop()
        return status

    status = run(go())
    assert status.request.ranks == [0, 1, 4]


def test_a_stalled_watch_takes_stacks(home):
    async def go():
        m = stepped(home, stall_auto_stacks=False)
        c = m.c
        agents = await m.start_agents(2)
        watch = await c.create_watch(WatchSpec(target="run", stalled=True, for_s=0, action="stacks"))
        for a in agents:
            a.training = False
        await m.tick_until(lambda: bool(c._watches.get(watch.id).firings), max_ticks=400)
        state = await c.get_watch(watch.id)
        page = await c.list()
        for a in agents:
            await a.stop()
        return state, page

    state, page = run(go())
    assert [p.id for p in page.profiles] == [state.firings[0].profile_id]
    assert page.profiles[0].kind == "stacks" and page.profiles[0].trigger.kind == "stalled"


def test_watches_survive_a_controller_restart_with_their_firings(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(3)
        agents[2].step_s = 3 * STEP_S
        watch = await c.create_watch(WatchSpec(target="run", rank_lag=3, for_s=0.1, action="stacks"))
        await m.tick_until(lambda: bool(c._watches.get(watch.id).firings), max_ticks=400)
        await until_saved(home, watch.id, lambda w: bool(w.firings), timeout_s=10)
        for a in agents:
            await a.stop()
        restarted = controller(home)
        return watch, await restarted.list_watches()

    watch, restored = run(go())
    assert [w.id for w in restored] == [watch.id]
    assert restored[0].spec == watch.spec and len(restored[0].firings) == 1
    assert restored[0].state == "WAITING"


def test_a_deleted_watch_is_gone_and_stays_gone_after_a_restart(home):
    async def go():
        c = controller(home)
        watch = await c.create_watch(slowdown())
        await c.delete_watch(watch.id)
        with pytest.raises(WatchNotFoundError):
            await c.get_watch(watch.id)
        return await controller(home).list_watches()

    assert run(go()) == []


def test_watches_beyond_the_limit_are_refused(home):
    async def go():
        c = controller(home, max_watches=1)
        await c.create_watch(slowdown())
        with pytest.raises(InvalidRequestError, match="RAYPROF_MAX_WATCHES"):
            await c.create_watch(slowdown())

    run(go())


@pytest.mark.parametrize(
    "fields",
    [{}, {"slower_than": 1.3, "stalled": True}, {"slower_than": 0.9}, {"slower_than": 1.3, "ranks": "lagging"}],
)
def test_a_watch_needs_exactly_one_sound_condition(fields):
    with pytest.raises(ValidationError):
        WatchSpec(target="run", **fields)


@pytest.mark.parametrize("condition", [dict(rank_lag=3), dict(stalled=True, action="stacks")])
def test_the_target_not_live_note_clears_once_the_target_is_live(home, condition):
    async def go():
        m = stepped(home, stall_auto_stacks=False)
        c = m.c
        watch = await c.create_watch(WatchSpec(target="run", for_s=0.1, **condition))
        await m.tick_until(lambda: c._watches.get(watch.id).note == "target not live", max_ticks=200)
        agents = await m.start_agents(2)
        await m.tick_until(lambda: c._watches.get(watch.id).note != "target not live", max_ticks=200)
        state = await c.get_watch(watch.id)
        for a in agents:
            await a.stop()
        return state

    assert run(go()).note is None

