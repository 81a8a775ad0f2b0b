"""The history answer: one run's points over a span, bounded to what a chart or a terminal can show.

A run of 1,024 ranks holds 613k points over 10 minutes (26 MB as JSON); a chart
is a few hundred pixels wide. So past ``max_points`` (all ranks together) the
answer is downsampled: each rank's points fall into equal buckets of time, each
bucket giving the last heartbeat's time and step and the median, least and
greatest step time in it; the slowest ranks (by their median) are listed, as
many as fit, and one band gives every rank's spread per bucket, so a rank left
out still shows where it is slow. A small run's answer is every point, as it
always was.

The points are copied on the event loop (:meth:`RunHistory.snapshot`, typed
arrays copied at C speed); :func:`answer` then runs in a thread, off the loop
the agents' polls are answered on.
"""

from __future__ import annotations

import bisect
import math
import statistics
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.models.history import BandSeries, RankSeries, TargetHistory

__all__ = ["MIN_BUCKETS", "Snapshot", "answer"]

# A downsampled series has at least this many buckets (a minute at 1 s each over 10 minutes):
# fewer would hide when a slowdown began.
MIN_BUCKETS = 60


@dataclass(frozen=True)
class Snapshot:
    """One run's points at one tier, copied: (rank, times, steps, step times), oldest first."""

    target: str
    run: str
    resolution_s: float
    span_s: float
    now: float
    columns: list[tuple[int, array, array, array]]


# (bucket end time, last step, median, least, greatest step time) of one bucket of one rank.
_Bucket = tuple[float, int, float | None, float | None, float | None]


def answer(snapshot: Snapshot, max_points: int) -> TargetHistory:
    """The answer for ``snapshot``: every point when they fit in ``max_points``, else downsampled."""
    since = snapshot.now - snapshot.span_s
    ranks = []
    for rank, t, step, dt in snapshot.columns:
        i = bisect.bisect_left(t, since)
        ranks.append((rank, t[i:], step[i:], dt[i:]))
    base = dict(target=snapshot.target, run=snapshot.run, span_s=snapshot.span_s, ranks_total=len(ranks))
    if sum(len(t) for _, t, _, _ in ranks) <= max_points:
        series = [
            RankSeries(rank=rank, t=t.tolist(), step=step.tolist(), step_time_s=[None if math.isnan(v) else v for v in dt])
            for rank, t, step, dt in ranks
        ]
        return TargetHistory(resolution_s=snapshot.resolution_s, ranks=series, **base)
    # Buckets: as many as a rank's share of the points, never under MIN_BUCKETS, and room for two series.
    wanted = min(max(MIN_BUCKETS, max_points // max(1, len(ranks))), max(1, max_points // 2))
    width = max(snapshot.resolution_s, snapshot.span_s / wanted)
    count = max(1, math.ceil(snapshot.span_s / width))
    bucketed = {rank: _buckets(t, step, dt, since, width, count) for rank, t, step, dt in ranks}
    # Listed ranks: the slowest, as many as fit beside the band.
    fit = max(1, max_points // count - 1)
    slowest = sorted(bucketed, key=lambda r: (-_median_of(bucketed[r]), r))[:fit]
    listed = sorted(slowest)
    series = [
        RankSeries(
            rank=rank,
            t=[b[0] for b in bucketed[rank]],
            step=[b[1] for b in bucketed[rank]],
            step_time_s=[b[2] for b in bucketed[rank]],
            step_time_min_s=[b[3] for b in bucketed[rank]],
            step_time_max_s=[b[4] for b in bucketed[rank]],
        )
        for rank in listed
    ]
    band = _band(bucketed.values(), since, width, count, snapshot.now) if len(listed) < len(bucketed) else None
    return TargetHistory(resolution_s=width, ranks=series, downsampled=True, band=band, **base)


def _buckets(t: array, step: array, dt: array, since: float, width: float, count: int) -> list[_Bucket]:
    found: list[_Bucket] = []
    current, values, last_t, last_step = -1, [], 0.0, 0
    for ti, si, vi in zip(t, step, dt, strict=True):
        b = min(count - 1, max(0, int((ti - since) // width)))
        if b != current:
            if current >= 0:
                found.append(_summary(last_t, last_step, values))
            current, values = b, []
        last_t, last_step = ti, si
        if not math.isnan(vi):
            values.append(vi)
    if current >= 0:
        found.append(_summary(last_t, last_step, values))
    return found


def _summary(t: float, step: int, values: list[float]) -> _Bucket:
    if not values:
        return t, step, None, None, None
    return t, step, statistics.median(values), min(values), max(values)


def _median_of(buckets: Sequence[_Bucket]) -> float:
    medians = [b[2] for b in buckets if b[2] is not None]
    return statistics.median(medians) if medians else -math.inf


def _band(ranks: Iterable[list[_Bucket]], since: float, width: float, count: int, now: float) -> BandSeries:
    """Per bucket across every rank: the least, the median of medians and the greatest step time."""
    lows: list[list[float]] = [[] for _ in range(count)]
    mids: list[list[float]] = [[] for _ in range(count)]
    highs: list[list[float]] = [[] for _ in range(count)]
    for buckets in ranks:
        for t, _, mid, lo, hi in buckets:
            if mid is None or lo is None or hi is None:
                continue
            b = min(count - 1, max(0, int((t - since) // width)))
            lows[b].append(lo)
            mids[b].append(mid)
            highs[b].append(hi)
    kept = [b for b in range(count) if mids[b]]
    return BandSeries(
        t=[min(now, since + (b + 1) * width) for b in kept],
        step_time_min_s=[min(lows[b]) for b in kept],
        step_time_median_s=[statistics.median(mids[b]) for b in kept],
        step_time_max_s=[max(highs[b]) for b in kept],
    )
