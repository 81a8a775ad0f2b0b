"""Put every rank's clock on one: shifts (and drifts) fitted to the ends of collectives the ranks share.

A collective that needs every rank's data (an NCCL kernel, a gloo op on its
worker thread) ends at nearly the same instant on all of them, so the k-th
end of a collective name on one rank and the k-th on another are two clocks
read at one moment. Matching by count, never by time, makes the fit blind to
how far apart the clocks start (seconds, even years), as long as both traces
start at the same collective (rayprof's windows start at the same step on
every rank; a trace cut from elsewhere shows a mismatch as large residuals).

Per rank, the fit is a line: ``merged = ts + shift + drift * (ts - pivot)``,
the drift being a clock running fast or slow (NTP leaves up to ~100 ppm, which
over a 2 s window is 200 µs). The line is Tukey's resistant line (medians of
the first and last thirds), so a few collectives that end apart (a mismatched
pair, a slow link) do not bend it; the drift is kept only where it leaves
a trend well above the scatter around it and is one a clock can have.

The error each rank reports (``residual_us``) is an upper bound over its
matched collectives: the largest distance left between a matched pair after
the fit, plus the timestamps' own resolution, plus the bound of the rank it
was fitted to. It bounds what the collectives can show: a skew that is the
same on every collective (one rank's kernels always ending x µs after the
other's) would read as clock offset.

A rank is fitted to the first rank (in rank order) that shares collectives
with it. Ranks that share none with the first rank's group form groups of
their own: each group's first rank is placed by its wall clock
(``baseTimeNanoseconds``, method ``base time``), as ranks with no collectives
at all are, and the rest of the group is fitted to it;
:func:`wall_clock_note` says which ranks stand on wall clocks only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Protocol

from orchestrator.models.merge_stats import RankAlignment

__all__ = ["MAX_DRIFT", "WALL_CLOCK_NOTE", "align", "wall_clock_note"]

MAX_DRIFT = 500e-6  # beyond what any clock drifts (NTP slews at most 500 ppm): a fit this steep is a mismatch
_MIN_FOR_DRIFT = 6  # matched pairs below which a slope is noise
_DRIFT_OVER_SCATTER = 4.0
WALL_CLOCK_NOTE = (
    "ranks on one host share its clock; hosts kept in step by NTP are typically within 1 ms of each other, "
    "unsynchronised hosts can be seconds apart"
)


class ClockSource(Protocol):
    """What the fit reads from a rank (a :class:`~orchestrator.traces.merge_plan.RankScan`)."""

    rank: int
    base_time_ns: int
    ends: dict[bool, dict[str, list[float]]]  # device or host -> collective name -> sorted end times


def _resolution(values: Sequence[float]) -> float:
    """The timestamps' step (1 µs for whole microseconds, down to 1 ns), and never below what a float holds
    at their size: at 1.7e15 µs (an epoch in µs) a double's step is 0.25 µs, and a few sums round by it."""
    floor = 2 * math.ulp(max(abs(v) for v in values))
    fractions = [v - math.floor(v) for v in values[:64]]
    for step in (1.0, 0.1, 0.01):
        if all(abs(f / step - round(f / step)) < 1e-3 for f in fractions):
            return max(step, floor)
    return max(0.001, floor)


def _fit(pairs: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(offset, drift, pivot, largest residual) of ``diff = offset + drift * (x - pivot)`` over (x, diff) pairs."""
    xs = sorted(x for x, _ in pairs)
    pivot = statistics.median(xs)
    offset = statistics.median(d for _, d in pairs)
    best = (offset, 0.0, pivot, max(abs(d - offset) for _, d in pairs))
    if len(pairs) < _MIN_FOR_DRIFT:
        return best
    ordered = sorted(pairs)
    third = len(ordered) // 3
    left, right = ordered[:third], ordered[-third:]
    dx = statistics.median(x for x, _ in right) - statistics.median(x for x, _ in left)
    if dx <= 0:
        return best
    drift = (statistics.median(d for _, d in right) - statistics.median(d for _, d in left)) / dx
    if abs(drift) > MAX_DRIFT:
        return best
    offset = statistics.median(d - drift * (x - pivot) for x, d in pairs)
    worst = max(abs(d - offset - drift * (x - pivot)) for x, d in pairs)
    # A slope is kept only where the drift it undoes over the matched span dwarfs the scatter around it: on
    # one host (no drift) a few collectives' jitter over 8 ms would otherwise read as hundreds of ppm.
    return (offset, drift, pivot, worst) if abs(drift) * (xs[-1] - xs[0]) > _DRIFT_OVER_SCATTER * worst else best


def _merged_ends(source: ClockSource, device: bool, placed: RankAlignment) -> dict[str, list[float]]:
    """The rank's collective ends on the merged clock."""
    return {
        name: [placed.merged_us(e) for e in ends]
        for name, ends in source.ends[device].items()
    }


def align(sources: Sequence[ClockSource], reference_ns: int) -> list[RankAlignment]:
    """Each rank's clock on the merged one (``reference_ns`` is its zero), in the order of ``sources``."""
    base = {s.rank: (s.base_time_ns - reference_ns) / 1000 for s in sources}
    # Device collectives where every rank has them (their ends are the device's), else host ones (gloo).
    device = all(s.ends[True] for s in sources)
    placed: dict[int, RankAlignment] = {}
    merged: dict[int, dict[str, list[float]]] = {}  # placed ranks' collective ends on the merged clock
    for s in sources:
        own = s.ends[device]
        if not own:
            placed[s.rank] = RankAlignment(rank=s.rank, method="base time", shift_us=base[s.rank])
            continue
        fitted = None
        for ref, ref_ends in merged.items():
            pairs = [
                (e + base[s.rank], r - (e + base[s.rank]))
                for name, ends in own.items() for r, e in zip(ref_ends.get(name, ()), ends)
            ]
            if pairs:
                fitted = ref, pairs
                break
        if fitted is None:
            # The first rank of a group sharing collectives: its wall clock places it, the group follows it.
            placed[s.rank] = RankAlignment(rank=s.rank, method="base time", shift_us=base[s.rank])
        else:
            ref, pairs = fitted
            offset, drift, pivot, worst = _fit(pairs)
            resolution = _resolution([e for ends in own.values() for e in ends])
            placed[s.rank] = RankAlignment(
                rank=s.rank, method="collectives", reference=ref, shift_us=base[s.rank] + offset,
                drift_ppm=drift * 1e6, pivot_us=pivot - base[s.rank], matched=len(pairs),
                residual_us=worst + resolution + (placed[ref].residual_us or 0.0), max_residual_us=worst,
            )
        merged[s.rank] = _merged_ends(s, device, placed[s.rank])
    # The first rank, when others are fitted to it, is the clock the rest are aligned on: its error is zero by
    # construction. (Other groups' first ranks stand on their wall clocks; their members' bounds are against them.)
    if sources and any(a.reference == sources[0].rank for a in placed.values()):
        root = placed[sources[0].rank]
        placed[root.rank] = root.model_copy(update={"method": "collectives", "residual_us": 0.0, "max_residual_us": 0.0})
    return [placed[s.rank] for s in sources]


def wall_clock_note(alignment: Sequence[RankAlignment]) -> str | None:
    """Which ranks stand on wall clocks only against the first rank (they share no collectives with its
    group); None when none do."""
    if len(alignment) < 2:
        return None
    by_rank = {a.rank: a for a in alignment}

    def root(a: RankAlignment) -> int:
        while a.reference is not None:
            a = by_rank[a.reference]
        return a.rank

    first = alignment[0].rank
    loose = [a for a in alignment if root(a) != first]
    if not loose:
        return None
    many = len(loose) > 1
    grouped = [a.rank for a in loose if a.reference is not None]
    return (
        f"rank{'s' if many else ''} {', '.join(str(a.rank) for a in loose)} share{'' if many else 's'} no collectives "
        f"with rank {first}: aligned with it on wall clocks only ({WALL_CLOCK_NOTE})"
        + (
            f"; rank{'s' if len(grouped) > 1 else ''} {', '.join(map(str, grouped))} {'are' if len(grouped) > 1 else 'is'} "
            "aligned on the collectives of their own group" if grouped else ""
        )
    )
