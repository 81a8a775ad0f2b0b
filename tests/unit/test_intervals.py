"""Interval arithmetic behind the phase split: the one-pass cover of start-ordered spans equals the sorting union."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis.intervals import by_time, cover, union
from orchestrator.analysis.spans import site, site_parts
from orchestrator.traces.loader import Span

# Times on a coarse grid, so that equal starts, touching ends and zero or negative durations all come up.
_SPANS = st.lists(
    st.tuples(st.integers(0, 40), st.integers(-3, 12), st.sampled_from(["aten::mm", "ProfilerStep#3", "cudaLaunchKernel"])),
    max_size=40,
)


def _in_loader_order(drawn: list[tuple[int, int, str]]) -> list[Span]:
    spans = [Span(float(ts), float(ts + dur), name, "cpu_op", 1, 1) for ts, dur, name in drawn]
    return sorted(spans, key=lambda s: (s.ts, -s.end))  # as load_rank sorts a rank's spans


@settings(max_examples=400, deadline=None)
@given(_SPANS)
def test_cover_of_start_ordered_spans_is_their_union(drawn: list[tuple[int, int, str]]) -> None:
    spans = _in_loader_order(drawn)
    assert cover(spans) == union((s.ts, s.end) for s in spans)


@settings(max_examples=400, deadline=None)
@given(_SPANS)
def test_cover_leaves_out_the_skipped_names_as_if_they_were_not_there(drawn: list[tuple[int, int, str]]) -> None:
    spans = _in_loader_order(drawn)
    skip = frozenset({"ProfilerStep#3"})
    assert cover(spans, skip=skip) == union((s.ts, s.end) for s in spans if s.name not in skip)


def test_cover_merges_touching_spans_and_drops_empty_ones() -> None:
    spans = _in_loader_order([(0, 5, "a"), (5, 3, "b"), (9, 0, "c"), (12, -2, "d"), (12, 1, "e")])
    assert cover(spans) == [(0.0, 8.0), (12.0, 13.0)]


@given(st.dictionaries(st.text(max_size=8), st.tuples(st.integers(0, 100), st.floats(0, 1e6)), max_size=12))
def test_tallies_become_op_stats_most_time_first_then_by_name(named: dict[str, tuple[int, float]]) -> None:
    stats = by_time(named)
    assert [(s.name, s.calls) for s in stats] == sorted(((n, c) for n, (c, _) in named.items()), key=lambda x: (-named[x[0]][1], x[0]))
    assert all(s.total_ms == named[s.name][1] / 1000 for s in stats)


_OP = st.text(min_size=1, max_size=12).filter(lambda t: " / " not in t and not t.startswith("/ ") and not t.endswith(" /"))


@given(st.one_of(st.none(), st.text(min_size=1, max_size=20)), _OP)
def test_a_site_splits_back_into_its_region_and_op(region: str | None, op: str) -> None:
    # Region names may hold " / " (a record_function label is any text); op names do not.
    assert site_parts(site(region, op)) == (region, op)
