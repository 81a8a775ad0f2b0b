"""`rayprof history`'s sparkline: bars from zero on one scale for every rank."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli.history_command import sparkline

BARS = "▁▂▃▄▅▆▇█"


def test_a_steady_run_with_a_few_percent_of_noise_draws_flat_bars():
    assert sparkline([0.0741, 0.0765, 0.0748, 0.0739, 0.0752], top=0.0765) == "█████"


def test_a_rank_twice_as_slow_stands_twice_as_tall_on_the_shared_scale():
    top = 0.2
    fast, slow = sparkline([0.1] * 4, top), sparkline([0.2] * 4, top)

    assert BARS.index(fast[0]) == round(0.5 * (len(BARS) - 1)) and slow == "████"


def test_a_slowdown_shows_as_taller_bars_after_it():
    line = sparkline([0.05] * 10 + [0.1] * 10, top=0.1, width=4)

    assert line == "▅▅██"


def test_points_with_no_step_time_are_blank():
    assert sparkline([None, None, 0.1, None], top=0.1) == "  █ "


def test_nothing_to_draw_is_empty_and_no_scale_is_the_lowest_bar():
    assert sparkline([], top=1.0) == ""
    assert sparkline([0.0, 0.0], top=0.0) == "▁▁"


_TIMES = st.lists(st.one_of(st.none(), st.floats(min_value=0, max_value=1e4, allow_nan=False)), max_size=500)


@given(values=_TIMES, width=st.integers(min_value=1, max_value=80))
def test_any_history_draws_at_most_width_bars_no_taller_than_the_top(values, width):
    top = max((v for v in values if v is not None), default=0.0)
    line = sparkline(values, top, width)

    assert len(line) <= width and set(line) <= set(BARS) | {" "}
    assert len(line) == (0 if not values else -(-len(values) // -(-len(values) // width)))


@given(low=st.floats(min_value=0, max_value=1e3), factor=st.floats(min_value=1, max_value=100))
def test_a_slower_point_is_never_drawn_shorter(low, factor):
    top = low * factor
    a, b = sparkline([low], top), sparkline([low * factor], top)

    assert BARS.index(a) <= BARS.index(b) if top > 0 else a == b == "▁"
