"""Stall and lag: the pure assessment over heartbeats, and the controller acting on it with fake agents."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from actors.controller.actor import Controller
from actors.controller.agents.registry import Registry
from actors.controller.diagnosis.health import assess, step_at
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.fake_agents import (
    EVALUATING,
    MONITORED,
    SLOW_THING,
    make_controller,
    run,
    worker_info,
)
from tests.support.stepped_runner import ManualClock, SteppedMonitor


@dataclass
class _Info:
    world_rank: int


@dataclass
class _Rank:
    info: _Info
    step: int
    step_time_s: float | None
    advanced_at: float
    heard_at: float
    samples: deque = field(default_factory=deque)


def rank(
    r: int, samples: list[tuple[float, int]], step_time_s: float = 0.1, advanced_at: float | None = None,
    heard_at: float | None = None,
) -> _Rank:
    """A rank whose heartbeats are ``samples`` (heard last at the last, unless ``heard_at``)."""
    last = samples[-1][0]
    return _Rank(
        _Info(r), samples[-1][1], step_time_s, last if advanced_at is None else advanced_at,
        last if heard_at is None else heard_at, deque(samples),
    )


def health(ranks, now, **kw):
    values = dict(stall_min_s=60.0, step_factor=20.0, lag_steps=3, heartbeat_s=10.0)
    values.update(kw)
    return assess(ranks, now, **values)


def test_step_at_interpolates_between_heartbeats_and_never_extrapolates():
    samples = [(0.0, 100), (10.0, 200)]
    assert step_at(samples, 5.0) == 150
    assert step_at(samples, 20.0) == 200
    assert step_at(samples, -1.0) == 100


def test_ranks_heartbeating_out_of_phase_are_not_taken_for_laggards():
    # Both train 10 steps/s; rank 1's last heartbeat is 7 s older than rank 0's.
    r0 = rank(0, [(0.0, 0), (10.0, 100), (20.0, 200)])
    r1 = rank(1, [(3.0, 30), (13.0, 130)])
    h = health([r0, r1], 20.0)
    assert h.behind == {0: 0, 1: 0}
    assert h.lagging == []


def test_a_rank_three_steps_behind_at_the_same_instant_is_lagging():
    r0 = rank(0, [(0.0, 0), (10.0, 100)])
    r1 = rank(1, [(0.0, 0), (10.0, 96)])
    h = health([r0, r1], 10.0)
    assert h.behind == {0: 0, 1: 4}
    assert h.lagging == [1]


def test_a_fast_jobs_ranks_whose_heartbeats_arrive_apart_are_not_taken_for_laggards():
    # A live two-rank GAN under DDP (5 ms steps, so in lockstep) showed "lagging 0 (-5)" once: heartbeats are
    # dated on arrival, and rank 0's arrived 25 ms after rank 1's. Five steps of 5 ms is no lag worth naming.
    r0 = rank(0, [(0.0, 0), (10.025, 2000)], step_time_s=0.005)
    r1 = rank(1, [(0.0, 0), (10.0, 2000)], step_time_s=0.005)
    h = health([r0, r1], 10.025)
    assert h.behind == {0: 5, 1: 0}
    assert h.lagging == []


def test_stalled_once_no_rank_advanced_for_the_threshold():
    ranks = [rank(r, [(0.0, 40), (70.0, 40)], advanced_at=0.0) for r in range(2)]
    assert not health(ranks, 59.0).stalled
    h = health(ranks, 61.0)
    assert h.stalled and h.threshold_s == 60.0 and h.stalled_s == pytest.approx(61.0)


def test_slow_steps_raise_the_stall_threshold_to_a_multiple_of_the_median_step():
    ranks = [rank(r, [(0.0, 40)], step_time_s=5.0, advanced_at=0.0) for r in range(3)]
    h = health(ranks, 99.0)
    assert h.threshold_s == 100.0 and not h.stalled


def test_ranks_silent_for_two_heartbeats_are_not_stalled_but_one_still_heard_is():
    # heartbeat_s 10: a live agent polls (and so heartbeats) at least every 10 s, blocked training or not.
    silent = [rank(r, [(0.0, 40)], advanced_at=0.0, heard_at=40.0) for r in range(2)]
    assert not health(silent, 61.0).stalled
    assert health([*silent, rank(2, [(0.0, 40)], advanced_at=0.0, heard_at=41.0)], 61.0).stalled


def test_one_rank_advancing_keeps_the_target_training():
    ranks = [rank(0, [(0.0, 40)], advanced_at=0.0), rank(1, [(0.0, 40), (99.0, 41)])]
    assert not health(ranks, 100.0).stalled


def test_the_registry_records_when_a_step_last_advanced_not_just_the_last_heartbeat():
    now = [0.0]
    registry = Registry(clock=lambda: now[0])
    registry.register(worker_info(0, 1))
    registry.heartbeat("run-job1-r0", 5, 0.1)
    now[0] = 10.0
    worker = registry.heartbeat("run-job1-r0", 5, 0.1)
    assert worker is not None and worker.seen_at == 10.0 and worker.advanced_at == 0.0
    now[0] = 20.0
    registry.heartbeat("run-job1-r0", 6, 0.1)
    assert worker.advanced_at == 20.0


# ---- the controller, with fake agents ---------------------------------------


def stepped(home: StorageSpec, **overrides) -> SteppedMonitor:
    """A controller on a clock of its own, its monitor ticked by the test (one tick: 0.05 s)."""
    clock = ManualClock()
    return SteppedMonitor(make_controller(home, clock, **{**MONITORED, **overrides}), clock)


def test_a_stuck_target_turns_stalled_takes_stacks_once_and_points_at_them(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(2)
        await c.ping()
        await m.ticks(10)
        assert (await c.targets())[0].health == "TRAINING"
        agents[1].stack = list(SLOW_THING)
        for a in agents:
            a.training = False  # stuck; the agents keep heartbeating

        async def stalled_with_stacks():
            t = (await c.targets())[0]
            return t if t.health == "STALLED" and t.stall_stacks else None

        target = await m.tick_until(stalled_with_stacks, max_ticks=200)
        assert target, "timed out"
        await m.ticks(20)
        page = await c.list()
        for a in agents:
            await a.stop()
        return target, page

    target, page = run(go())
    assert target.stalled_s >= target.stall_threshold_s == 0.5
    stacks = [p for p in page.profiles if p.kind == "stacks"]
    assert [p.id for p in stacks] == [target.stall_stacks]
    assert stacks[0].trigger.kind == "stalled" and stacks[0].trigger.watch_id is None
    assert stacks[0].reason is None
    assert target.stall_verdict is not None and target.stall_verdict.startswith("rank 1 is in train.py:57 in slow_thing; ")


def test_a_run_stalled_in_an_evaluation_says_so_with_its_stacks(home):
    # Every rank in a transformers Trainer's evaluate for longer than the stall threshold: slow, not hung.
    async def go():
        m = stepped(home)
        agents = await m.start_agents(2)
        for a in agents:
            a.stack, a.training = list(EVALUATING), False

        async def stalled_with_stacks():
            t = (await m.c.targets())[0]
            return t if t.stall_verdict else None

        target = await m.tick_until(stalled_with_stacks, max_ticks=200)
        for a in agents:
            await a.stop()
        return target

    target = run(go())
    assert target and target.health == "STALLED"
    assert target.stall_verdict == (
        "ranks 0, 1 are evaluating (trainer.py:2871 in evaluate), in forward (linear.py:134) from train.py:12 in train_func"
    )


async def _stalled_without_auto_stacks(home: StorageSpec) -> tuple[SteppedMonitor, list]:
    """Two ranks that stopped training (their agents still beat), ticked until the target is STALLED."""
    m = stepped(home, stall_auto_stacks=False)
    agents = await m.start_agents(2)
    for a in agents:
        a.training = False
    assert await m.tick_until(lambda: _health_is(m.c, "STALLED"), max_ticks=200), "timed out"
    return m, agents


def test_automatic_stacks_on_stall_can_be_turned_off(home):
    async def go():
        m, agents = await _stalled_without_auto_stacks(home)
        c = m.c
        await m.ticks(10)
        page = await c.list()
        for a in agents:
            await a.stop()
        return page

    assert run(go()).total == 0


def test_a_window_waiting_on_a_stalled_run_says_so_and_stops_saying_it_once_the_run_moves(home):
    async def go():
        m, agents = await _stalled_without_auto_stacks(home)
        c = m.c
        submitted = await c.submit(ProfileRequest(target="run", steps=3))
        await m.ticks(5)
        waiting = await c.get(submitted.id)
        for a in agents:
            a.training = True
        assert await m.tick_until(lambda: _health_is(c, "TRAINING"), max_ticks=200), "timed out"
        moving = await c.get(submitted.id)
        for a in agents:
            await a.stop()
        return waiting, moving

    waiting, moving = run(go())
    assert waiting.state in (ProfileState.PENDING, ProfileState.SCHEDULED)
    assert waiting.reason is not None and waiting.reason.startswith("run is STALLED: no rank has advanced for ")
    assert "opens only once it moves again" in waiting.reason
    assert moving.reason is None or "STALLED" not in moving.reason


def test_a_window_on_a_run_that_trains_carries_no_stall_note(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(2)
        submitted = await c.submit(ProfileRequest(target="run", steps=50))
        await m.ticks(5)
        status = await c.get(submitted.id)
        for a in agents:
            await a.stop()
        return status

    assert run(go()).reason is None


async def _health_is(c: Controller, value: str) -> bool:
    targets = await c.targets()
    return bool(targets) and targets[0].health == value


def test_a_rank_that_falls_behind_is_named_in_targets_with_its_steps_behind(home):
    async def go():
        m = stepped(home)
        c = m.c
        agents = await m.start_agents(3)
        agents[2].step_s = 0.03

        async def lagging():
            t = (await c.targets())[0]
            return t if t.lagging_ranks else None

        target = await m.tick_until(lagging, max_ticks=200)
        assert target, "timed out"
        for a in agents:
            await a.stop()
        return target

    target = run(go())
    assert target.lagging_ranks == [2]
    assert target.ranks[2].steps_behind >= 3 and target.ranks[0].steps_behind <= 1
    assert target.health == "TRAINING"


def test_a_run_whose_ranks_all_fell_silent_is_not_stalled_and_takes_no_stacks(home):
    # A run that ends (Ray Train kills its workers) stops heartbeating: its steps stop too, and until the reaper
    # drops its workers (poll timeout + grace) it looked stalled, with stacks taken of workers that are gone. A
    # stalled rank still heartbeats (its agent's own thread polls while training is blocked).
    async def go():
        m = stepped(home, worker_expiry_grace_s=60.0)
        c = m.c
        agents = await m.start_agents(2)
        await c.ping()
        await m.ticks(10)
        assert (await c.targets())[0].health == "TRAINING"
        for a in agents:
            await a.stop()  # the run ended: no step, no heartbeat
        await m.ticks(40)  # 2 s: four times the stall threshold, before any expiry
        target = (await c.targets())[0]
        page = await c.list()
        return target, page

    target, page = run(go())
    assert target.health != "STALLED"
    assert [p for p in page.profiles if p.kind == "stacks"] == []
