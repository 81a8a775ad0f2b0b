"""The rank's step time from the step counter (actors/agent/pace.py): each heartbeat's, and the steps just before a
window, which the window's trace carries (tests/unit/test_capture.py). Time is stepped, never slept."""

from __future__ import annotations

import pytest

from actors.agent.pace import LOOKBACK_S, Measure, Pace


def test_a_heartbeat_carries_the_last_measure_of_at_least_a_second() -> None:
    pace = Pace()
    assert pace.sample(0, 100.0) is None
    assert pace.sample(1, 100.01) is None  # one step in 10 ms: too short a span to trust
    assert pace.sample(30, 101.5) == pytest.approx(1.5 / 30)
    assert pace.sample(30, 103.0) == pytest.approx(1.5 / 30)  # no step since: the last measure stands


def test_the_steps_before_a_window_run_from_the_earliest_recent_heartbeat_to_its_arming() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    assert pace.before_window(50, 104.0) == Measure(steps=50, span_s=4.0, began=100.0)


def test_a_window_armed_right_after_a_heartbeat_still_gets_the_span_before_it() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    assert pace.before_window(21, 102.25) == Measure(steps=21, span_s=2.25, began=100.0)


def test_a_window_armed_right_after_the_last_one_closed_gets_the_pace_the_last_one_got() -> None:
    # Windows back to back (a schedule, a test's profiles): no clean second since the last close.
    pace = Pace()
    pace.sample(0, 100.0)
    first = pace.before_window(40, 102.0)
    assert first == Measure(steps=40, span_s=2.0, began=100.0)
    pace.window_closed(50, 103.0)
    assert pace.before_window(60, 103.8) == first._replace(windows_before=1)
    pace.window_closed(70, 104.5)
    assert pace.before_window(75, 104.5 + LOOKBACK_S + 1) is None  # nothing of the last minute, nor the last measure


def test_a_burst_of_polls_just_before_the_arming_keeps_the_measure() -> None:
    # A sync round (as the controller schedules a window) polls many times within a second.
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(100, 110.0)
    for i in range(200):
        pace.sample(150, 114.5 + i * 0.002)
    assert pace.before_window(160, 115.0) == Measure(steps=160, span_s=15.0, began=100.0)


def test_heartbeats_older_than_the_lookback_are_not_the_pace_now() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(500, 150.0)
    assert pace.before_window(600, 100.0 + LOOKBACK_S + 5) == Measure(steps=100, span_s=15.0, began=150.0)


def test_no_measure_is_known_before_a_second_has_passed_nor_while_the_rank_stands_still() -> None:
    pace = Pace()
    assert pace.before_window(5, 100.0) is None
    pace.sample(5, 100.0)
    assert pace.before_window(6, 100.5) is None
    assert pace.before_window(5, 110.0) is None


def test_steps_that_ran_under_the_last_window_are_not_the_jobs_own_pace() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    pace.window_closed(30, 102.5)  # steps 20..30 ran under the last window
    assert pace.before_window(31, 103.0) is None  # half a second since the close
    assert pace.before_window(45, 104.0) == Measure(steps=15, span_s=1.5, began=102.5, windows_before=1)
    pace.sample(45, 104.0)
    assert pace.before_window(60, 105.5) == Measure(steps=30, span_s=3.0, began=102.5, windows_before=1)
