"""Interval arithmetic behind the phase split: the one-pass cover of start-ordered spans equals the sorting union."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis.intervals import cover, union
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
