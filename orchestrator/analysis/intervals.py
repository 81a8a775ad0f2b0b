"""Sorted, disjoint time intervals: the arithmetic behind the phase split.

An interval list is a list of ``(start, end)`` tuples, sorted, non-overlapping,
with ``start < end``. Every function here returns one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Protocol

from orchestrator.models.analysis import OpStat

__all__ = [
    "Intervals", "Timed", "by_time", "clip", "cover", "intersect", "membership", "name_innermost", "subtract", "total", "union",
]

Intervals = list[tuple[float, float]]
_START = itemgetter(0)


class Timed(Protocol):
    """Anything with a name, a start and an end: a trace span."""

    @property
    def name(self) -> str: ...
    @property
    def ts(self) -> float: ...
    @property
    def end(self) -> float: ...


def union(spans: Iterable[tuple[float, float]]) -> Intervals:
    """Merge possibly overlapping spans into an interval list."""
    out: Intervals = []
    # Sorted on the start alone (a float compare, not a tuple's): the order of equal starts leaves the union the same.
    for start, end in sorted(spans, key=_START):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def cover(spans: Iterable[Timed], skip: frozenset[str] = frozenset()) -> Intervals:
    """:func:`union` of spans already in start order (a thread's, or the device's, as the loader sorts them),
    less those named in ``skip``: one pass, with no sort and no tuple per span."""
    out: Intervals = []
    start = end = 0.0
    open_ = False
    for span in spans:
        ts = span.ts
        if open_ and ts <= end:
            if span.end > end:
                if skip and span.name in skip:
                    continue
                end = span.end
            continue
        if skip and span.name in skip:
            continue
        if open_ and end > start:
            out.append((start, end))
        start, end, open_ = ts, span.end, True
    if open_ and end > start:
        out.append((start, end))
    return out


def clip(intervals: Intervals, start: float, end: float) -> Intervals:
    """The part of ``intervals`` inside ``[start, end)``, found by bisection."""
    # Intervals are disjoint and sorted, so their ends are sorted too.
    i = bisect.bisect_right(intervals, start, key=lambda iv: iv[1])
    out: Intervals = []
    for s, e in intervals[i:]:
        if s >= end:
            break
        s, e = max(s, start), min(e, end)
        if s < e:
            out.append((s, e))
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by both lists."""
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time in ``a`` not covered by ``b``."""
    out: Intervals = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def membership(intervals: Intervals) -> Callable[[float], bool]:
    """A test of whether a time lies in ``intervals`` (``[start, end)``), by bisection."""
    starts = [s for s, _ in intervals]

    def inside(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t < intervals[i][1]

    return inside


def total(intervals: Intervals) -> float:
    """Summed length."""
    return sum(e - s for s, e in intervals)


def name_innermost(
    spans: Sequence[Timed], pieces: Intervals, skip: frozenset[str], named: dict[str, list[float]], outside: str
) -> None:
    """Add to ``named`` (name -> [pieces, time]) the time of ``pieces`` under each innermost open span of ``spans``
    (sorted by start, then longest first), and under ``outside`` the time under none: one sweep of both.

    The open spans are kept as parallel lists of ends and names: this loop runs once per span of the thread.
    """
    ends: list[float] = []
    names: list[str] = []
    i, n = 0, len(spans)
    for a, b in pieces:
        # Open every span that starts by ``a`` and is still open at ``a`` (most end before: skipped without a push).
        while i < n:
            span = spans[i]
            ts = span.ts
            if ts > a:
                break
            i += 1
            if span.end <= a:
                continue
            while ends and ends[-1] <= ts:
                ends.pop()
                names.pop()
            if span.name not in skip:
                ends.append(span.end)
                names.append(span.name)
        while ends and ends[-1] <= a:
            ends.pop()
            names.pop()
        cur = a
        seen: set[str] = set()
        while cur < b:
            nxt = b
            if i < n and spans[i].ts < nxt:
                nxt = spans[i].ts
            if ends and ends[-1] < nxt:
                nxt = ends[-1]
            name = names[-1] if names else outside
            entry = named[name]
            entry[1] += nxt - cur
            if name not in seen:
                entry[0] += 1
                seen.add(name)
            cur = nxt
            while ends and ends[-1] <= cur:
                ends.pop()
                names.pop()
            while i < n and spans[i].ts <= cur:
                span = spans[i]
                while ends and ends[-1] <= span.ts:
                    ends.pop()
                    names.pop()
                if span.name not in skip:
                    ends.append(span.end)
                    names.append(span.name)
                i += 1


def by_time(named: Mapping[str, Sequence[float]]) -> list[OpStat]:
    """Tallies of (calls, µs) per name (:func:`name_innermost`'s, a rank's ops and kernels) as :class:`OpStat`, most
    time first, then by name."""
    rows = sorted(named.items(), key=lambda kv: (-kv[1][1], kv[0]))
    return [OpStat(name=name, calls=int(calls), total_ms=us / 1000) for name, (calls, us) in rows]
