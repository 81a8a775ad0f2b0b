"""The rank's step time from the step counter (actors/agent/pace.py): each heartbeat's, and the steps just before a
window, which the window's trace carries (tests/unit/test_capture.py). Time is stepped, never slept."""

from __future__ import annotations

import pytest

from actors.agent.pace import Measure, Pace


def test_a_heartbeat_carries_the_last_measure_of_at_least_a_second() -> None:
    pace = Pace()
    assert pace.sample(0, 100.0) is None
    assert pace.sample(1, 100.01) is None  # one step in 10 ms: too short a span to trust
    assert pace.sample(30, 101.5) == pytest.approx(1.5 / 30)
    assert pace.sample(30, 103.0) == pytest.approx(1.5 / 30)  # no step since: the last measure stands


def test_the_steps_before_a_window_run_up_to_its_arming() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    assert pace.before_window(50, 104.0) == Measure(steps=30, span_s=2.0, began=102.0)


def test_under_a_second_since_the_last_heartbeat_the_last_measure_stands() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    assert pace.before_window(25, 102.5) == Measure(steps=20, span_s=2.0, began=100.0)


def test_no_measure_is_known_before_the_second_heartbeat_nor_while_the_rank_stands_still() -> None:
    pace = Pace()
    assert pace.before_window(5, 100.0) is None
    pace.sample(5, 100.0)
    assert pace.before_window(5, 110.0) is None


def test_a_measure_that_began_before_the_last_window_closed_is_not_the_jobs_own_pace() -> None:
    pace = Pace()
    pace.sample(0, 100.0)
    pace.sample(20, 102.0)
    pace.window_closed(102.5)  # steps 20..30 ran under the last window
    assert pace.before_window(30, 103.5) is None
    pace.sample(30, 103.5)
    pace.sample(45, 105.0)
    assert pace.before_window(45, 105.0) == Measure(steps=15, span_s=1.5, began=103.5)
