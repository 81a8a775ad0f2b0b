"""Step-time history: tiers, bounds, memory, saving; the post-window check, pure and on the controller."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from actors.controller.monitoring.post_window_check import check_rank, segments
from actors.controller.monitoring.step_history import TIERS, RankHistory, RunHistory, compress
from orchestrator.errors import TargetNotFoundError
from orchestrator.models.requests import ProfileRequest
from tests.support.fake_agents import MONITORED, make_controller, run, start_agents, until, wait_terminal
from tests.support.stepped_runner import ManualClock, SteppedMonitor


def _fill(history: RankHistory, seconds: float, step_s: float = 0.1, start: float = 1e9) -> None:
    """Heartbeats over ``seconds``, just often enough to fill every tier: each tier's resolution within its span."""
    end = start + seconds
    t, step = start, 0
    while t < end:
        step += 10
        history.add(t, step, step_s)
        left = end - t
        t += next((tier.resolution_s for tier in TIERS if left <= tier.span_s + tier.resolution_s), TIERS[-1].resolution_s)


def test_each_tier_keeps_its_span_at_its_resolution_and_no_more():
    h = RankHistory()
    _fill(h, 30 * 3600)
    for tier, series in zip(TIERS, h.tiers, strict=True):
        points = list(series.points())
        assert len(points) == tier.capacity + 1  # full ring, plus the point being filled
        # One point per interval of the tier's resolution: never two in one.
        buckets = [int(p[0] // tier.resolution_s) for p in points]
        assert buckets == sorted(set(buckets))
    end = 1e9 + 30 * 3600
    # The coarsest tier reaches back 24 h; the finest only 10 minutes.
    assert end - h.tiers[-1].ring.ordered()[0][0] == pytest.approx(86400, abs=120)
    assert end - h.tiers[0].ring.ordered()[0][0] == pytest.approx(600, abs=12)


def test_a_point_keeps_the_last_heartbeat_and_the_mean_step_time_of_its_interval():
    h = RankHistory()
    for i, step_s in enumerate([0.1, 0.3, 0.2]):
        h.add(1000.0 + i * 3, 10 * (i + 1), step_s)  # three heartbeats within one 10 s point
    t, step, dt = list(h.tiers[1].points())[-1]
    assert (t, step) == (1006.0, 30)
    assert dt == pytest.approx(0.2)


def test_history_memory_per_rank_after_24_hours_is_bounded():
    ranks = 64
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run_history = RunHistory("t", "job")
    for rank in range(ranks):
        _fill(run_history.ranks.setdefault(rank, RankHistory()), 26 * 3600)
    per_rank = (tracemalloc.get_traced_memory()[0] - before) / ranks
    tracemalloc.stop()
    points = sum(t.capacity for t in TIERS)
    assert points * 20 <= per_rank < points * 20 * 1.25 + 2048, per_rank


def test_a_saved_history_loads_back_point_for_point():
    run_history = RunHistory("t", "job")
    for rank in range(3):
        _fill(run_history.ranks.setdefault(rank, RankHistory()), 3 * 3600)
    loaded = RunHistory.load(compress(run_history.dump()))
    assert (loaded.target, loaded.run) == ("t", "job")
    for rank in range(3):
        for tier in range(len(TIERS)):
            # A full ring and its point being filled come back as the newest ``capacity`` points.
            kept = list(run_history.ranks[rank].tiers[tier].points())[-TIERS[tier].capacity :]
            back = list(loaded.ranks[rank].tiers[tier].points())
            assert [(t, step) for t, step, _ in back] == [(t, step) for t, step, _ in kept]
            assert [dt for *_, dt in back] == pytest.approx([dt for *_, dt in kept])


def _points(step_times: list[float], start_step: int = 0) -> list[tuple[float, int, float]]:
    """One heartbeat every 10 steps; ``step_times``: the step time of each 10-step stretch."""
    t, step, points = 1e9, start_step, [(1e9, start_step, 0.1)]
    for s in step_times:
        t += 10 * s
        step += 10
        points.append((t, step, s))
    return points


def test_segments_join_heartbeats_closer_than_a_second():
    points = [(0.0, 0, 0.1), (0.2, 2, 0.1), (1.0, 10, 0.1), (2.0, 20, 0.1)]
    assert segments(points) == [(0.0, 0, 10, pytest.approx(0.1)), (1.0, 10, 20, pytest.approx(0.1))]


def test_a_rank_back_to_its_step_time_after_the_window_is_ok():
    # Steps 0-100 at 0.1 s, the window 100-120 at 0.5 s, then 0.1 s again.
    points = _points([0.1] * 10 + [0.5] * 2 + [0.1] * 10)
    result = check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=50, done_at=0.0)
    assert result.verdict == "ok"
    assert result.ratio == pytest.approx(1.0)


def test_a_rank_that_stays_slower_for_more_than_n_steps_is_reported():
    points = _points([0.1] * 10 + [0.5] * 2 + [0.13] * 10)
    result = check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=50, done_at=0.0)
    assert result.verdict == "slower"
    assert result.ratio == pytest.approx(1.3)
    assert result.slow_steps > 50


def test_one_slow_heartbeat_segment_does_not_decide_even_over_n_steps():
    # Fast steps: one segment spans more than N steps; a noisy one must not make the rank "slower".
    points = _points([0.1] * 10 + [0.5] * 2)
    t, step = points[-1][0], points[-1][1]
    points.append((t + 60 * 0.13, step + 60, 0.13))
    assert check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=50, done_at=0.0).verdict == "pending"


def test_a_check_waits_until_it_has_n_steps_after_the_window():
    points = _points([0.1] * 10 + [0.5] * 2 + [0.13] * 3)
    assert check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=50, done_at=0.0).verdict == "pending"


def test_steps_before_the_rank_finished_its_window_are_not_after_it():
    # The trace's export and upload slow the first stretch after the window; the rank reports DONE
    # once they are over, and only what follows is compared.
    points = _points([0.1] * 10 + [0.5] * 2 + [0.3] * 3 + [0.1] * 10)
    done_at = points[15][0]
    assert check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=20, done_at=done_at).verdict == "ok"
    assert check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=20, done_at=0.0).verdict == "slower"
    assert check_rank(0, points, first_step=100, stop_step=120, threshold=1.1, steps=20).verdict == "pending"


# ---- on the controller, with fake agents ------------------------------------------


def test_the_controller_keeps_each_ranks_history_and_serves_it(home):
    async def scenario():
        c = make_controller(home, **MONITORED)
        agents = await start_agents(c, 2)
        await c.ping()
        assert await until(lambda: len(c._telemetry.history.runs) == 1 and all(
            len(list(r.tiers[0].points())) >= 3 for r in next(iter(c._telemetry.history.runs.values())).ranks.values()
        ), timeout_s=10)
        view = await c.history("run")
        assert [r.rank for r in view.ranks] == [0, 1]
        assert view.resolution_s == 1.0
        assert all(r.step == sorted(r.step) and r.step_time_s[-1] == pytest.approx(0.01) for r in view.ranks)
        assert (await c.history("run", span_s=3 * 3600)).resolution_s == 60.0
        with pytest.raises(TargetNotFoundError):
            await c.history("nope")
        await c._telemetry.save()
        for a in agents:
            await a.stop()
        # A new controller on the same storage reads it back.
        c2 = make_controller(home, **MONITORED)
        await c2.ping()
        assert await until(lambda: c2._telemetry.history.runs, timeout_s=30)
        again = await c2.history("run", "job1")
        for before, after in zip(view.ranks, again.ranks, strict=True):
            assert set(before.t[:-1]) <= set(after.t)  # the last point was still being filled

    run(scenario())


def test_a_window_that_leaves_a_rank_slower_is_said_in_its_status_and_saved(home):
    async def scenario():
        clock = ManualClock()
        # The ranks train, and their heartbeats are dated, on the stepped clock: each tick moves both.
        m = SteppedMonitor(
            make_controller(home, clock, post_window_steps=5, post_window_slowdown=1.5, **MONITORED), clock, wall=True
        )
        c = m.c
        # The agents date their reports (a window's end) on real time; the controller's wall clock runs
        # ahead of it, so the heartbeats after a window come after its end however slow the machine is.
        clock.forward(60)
        agents = await m.start_agents(2)
        await c.ping()

        def baseline() -> bool:  # heartbeats before the window, over a few seconds of the 1 s tier
            runs = list(c._telemetry.history.runs.values())
            return len(runs) == 1 and len(runs[0].ranks) == 2 and all(
                len(list(r.tiers[0].points())) >= 3 for r in runs[0].ranks.values()
            )

        assert await m.tick_until(baseline, max_ticks=400)
        status = await c.submit(ProfileRequest(target="run", steps=5))
        # Rank 1 keeps running 20x slower once its window is over: the profiler did not let go.
        assert await m.tick_until(
            lambda: agents[1].windows and agents[1].step >= agents[1].windows[0].stop_step, max_ticks=400
        )
        agents[1].step_s = 0.2
        final, _ = await wait_terminal(c, status.id)
        assert await until(lambda: c._profiles.get(status.id) is None, timeout_s=30)

        async def checked():
            s = await c.get(status.id)
            return s.post_window is not None and s.post_window.final

        await m.tick_until(checked, max_ticks=800)
        check = (await c.get(status.id)).post_window
        assert check is not None and check.verdict == "slower", check
        by_rank = {r.rank: r for r in check.ranks}
        assert by_rank[1].verdict == "slower" and by_rank[1].ratio > 2
        # Rank 0 ran on as before (its own timer's jitter aside: the pure tests pin "ok" exactly).
        assert by_rank[0].ratio < by_rank[1].ratio
        assert "may not have let go" in check.detail and "restarting the workers" in check.detail
        # The check is saved: a restarted controller reads it from the profile's state. Its save is
        # spawned when the check ends, so the restart is tried again, bounded, until it lands.
        for _ in range(100):
            restored = (await make_controller(home).get(status.id)).post_window
            if restored == check:
                break
            await asyncio.sleep(0.1)
        assert restored == check
        for a in agents:
            await a.stop()

    run(scenario(), timeout_s=60)


def test_a_live_run_with_no_points_yet_has_an_empty_history_not_a_404(home):
    # The console asks for a target's history as soon as its card shows: a run that just
    # registered, or a controller with history off, has no points, but it is not unknown.
    async def scenario():
        c = make_controller(home, history=False)
        agents = await start_agents(c, 2)
        view = await c.history("run")
        named = await c.history("run", "job1")
        with pytest.raises(TargetNotFoundError):
            await c.history("run", "no-such-job")
        with pytest.raises(TargetNotFoundError):
            await c.history("nope")
        for a in agents:
            await a.stop()
        return view, named

    view, named = run(scenario())
    assert (view.target, view.run, view.ranks, view.resolution_s) == ("run", "job1", [], 1.0)
    assert named == view
