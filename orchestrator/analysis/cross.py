"""Cross-rank analysis: step-time spread and straggler ranks.

In synchronous data parallelism every rank's *step time* is about the same,
because each waits for the slowest at the gradient allreduce. What differs is
how the step is spent: the straggler is *busy* (computing, loading) for longer
and *waits* in collectives the least, while the fast ranks show the difference
as communication wait. So stragglers are found from busy time
(step time minus communication wait), never from step time or comm time alone.

A rank can also hold the others back without being busier: it *arrives
late*, starting its step after the others (work between steps, a slow host).
Then the early ranks wait in the step's first collective or in a
``cudaStreamSynchronize`` on it, and their steps look longest. So each common
step measures each rank's start lag behind the earliest rank and its extra
wait over the least-waiting rank: the *late arrivers* are the ranks that start
last (within ``ARRIVAL_MIN_*`` of the latest start), the *waiters* the others
that wait by more than ``ARRIVAL_MIN_*``. Start times are on the merged
trace's clock (:func:`~orchestrator.traces.clocks.align`: fitted to the ends of
the collectives the ranks share, to within each rank's ``residual_us``), so
the verdicts do not depend on how far apart the ranks' clocks were; ranks that
share no collectives are compared on wall clocks, as the summary's issues say.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from orchestrator.analysis.idle_summary import NAMING_FIELDS, summarize
from orchestrator.models.analysis import PHASES, RankSummary, StepBreakdown, StepSpread, Straggler

__all__ = [
    "ARRIVAL_MIN_FRACTION",
    "ARRIVAL_MIN_MS",
    "STRAGGLER_MIN_EXCESS_FRACTION",
    "STRAGGLER_MIN_EXCESS_MS",
    "STRAGGLER_MIN_SLOWER_SHARE",
    "StragglerImpl",
    "busy_time_stragglers",
    "arrivals",
    "blame_late_ranks",
    "common_steps",
    "late_arrivers",
    "step_spread",
    "step_excesses",
    "stragglers",
    "unheld_step_ms",
    "wait_ms",
]

# A rank is a straggler when its busy time per step exceeds the reference by
# this share of the step time the others would have without waiting for it
# (see unheld_step_ms), and by at least this many milliseconds (so that
# microsecond noise on tiny steps is not called out).
STRAGGLER_MIN_EXCESS_FRACTION = 0.15
STRAGGLER_MIN_EXCESS_MS = 1.0
# ...and is busier than the reference in at least this share of the common steps. Two ranks beside other processes
# on two cores trade places: the rank on the core the other process takes is slower while it stays there, for half a
# window or more (the live healthy job: one rank slower by 5-15 ms in steps 11-20 of 20, faster in 8 of the others,
# a median excess at the bar). A rank that holds the others back is slower step after step.
STRAGGLER_MIN_SLOWER_SHARE = 0.75
# A rank waits, or arrives late, when it does so by more than this share of the
# median step time and at least this many milliseconds (clock offsets between hosts are ~1 ms).
ARRIVAL_MIN_FRACTION = 0.05
ARRIVAL_MIN_MS = 1.0

StragglerImpl = Callable[[Sequence[RankSummary]], list[Straggler]]
"""Pluggable straggler identification: ranks in, stragglers out (sorted by rank)."""


def common_steps(ranks: Sequence[RankSummary]) -> list[int]:
    """Step numbers present on every rank that has ProfilerStep spans."""
    sets = [{s.step for s in r.steps} for r in ranks if r.steps and r.window == "profiler_steps"]
    return sorted(set.intersection(*sets)) if sets else []


class Arrivals:
    """Per rank, medians over common steps: start lag behind the earliest rank, extra wait over the least-waiting one."""

    def __init__(self, lag_ms: dict[int, float], extra_wait_ms: dict[int, float], ready_ms: dict[int, float], threshold_ms: float):
        self.lag_ms, self.extra_wait_ms, self.ready_ms, self.threshold_ms = lag_ms, extra_wait_ms, ready_ms, threshold_ms

    @property
    def late(self) -> list[int]:
        """The last to arrive: within the threshold of the latest start, and late by at least the threshold.

        Only they hold the step back: a rank that starts late but before them
        waits for them as well (rank 0 of PARAM's DLRM starts 5.5 ms late and
        still waits 4 ms for ranks 2, 6 and 7).
        """
        latest = max(self.lag_ms.values())
        return sorted(r for r, lag in self.lag_ms.items() if lag >= self.threshold_ms and lag >= latest - self.threshold_ms)

    @property
    def waiting(self) -> list[int]:
        """Ranks that are not late and wait for the others by at least the threshold."""
        late = set(self.late)
        return sorted(r for r, w in self.extra_wait_ms.items() if w >= self.threshold_ms and r not in late)


def arrivals(ranks: Sequence[RankSummary]) -> Arrivals | None:
    """Start lags, extra waits and ready times (start lag + busy time) over the common steps; None without two such ranks."""
    steps = common_steps(ranks)
    timed = [r for r in ranks if r.window == "profiler_steps" and r.steps]
    if len(timed) < 2 or not steps:
        return None
    wanted = set(steps)
    by_rank = {r.rank: {s.step: s for s in r.steps if s.step in wanted} for r in timed}
    lags: dict[int, list[float]] = {r.rank: [] for r in timed}
    waits: dict[int, list[float]] = {r.rank: [] for r in timed}
    ready: dict[int, list[float]] = {r.rank: [] for r in timed}
    for step in steps:
        here = {rank: by_step[step] for rank, by_step in by_rank.items()}
        first = min(s.start_unix_us for s in here.values())
        least = min(wait_ms(s) for s in here.values())
        for rank, s in here.items():
            lag = (s.start_unix_us - first) / 1000
            lags[rank].append(lag)
            waits[rank].append(wait_ms(s) - least)
            ready[rank].append(lag + s.duration_ms - wait_ms(s))
    median_step = statistics.median(r.median_step_ms for r in timed if r.median_step_ms is not None)
    return Arrivals(
        lag_ms={r: statistics.median(v) for r, v in lags.items()},
        extra_wait_ms={r: statistics.median(v) for r, v in waits.items()},
        ready_ms={r: statistics.median(v) for r, v in ready.items()},
        threshold_ms=max(ARRIVAL_MIN_MS, ARRIVAL_MIN_FRACTION * median_step),
    )


def step_spread(ranks: Sequence[RankSummary]) -> StepSpread | None:
    """How far the per-rank median step times lie apart, who arrives late and who waits; None with fewer than two ranks.

    The slowest rank is the one whose own work ends last (start lag plus busy
    time), never a rank whose step is long because it waits for the others.
    """
    timed = [r for r in ranks if r.median_step_ms is not None]
    if len(timed) < 2:
        return None
    longest = max(r.median_step_ms for r in timed)
    shortest = min(r.median_step_ms for r in timed)
    median = statistics.median(r.median_step_ms for r in timed)
    arr = arrivals(timed)
    if arr is not None:
        slowest = max(arr.ready_ms, key=lambda k: (arr.ready_ms[k], -k))
        fastest = min(arr.ready_ms, key=lambda k: (arr.ready_ms[k], k))
    else:
        busy = {r.rank: r.median_step_ms - r.comm_wait_ms for r in timed}
        slowest, fastest = max(busy, key=busy.__getitem__), min(busy, key=busy.__getitem__)
    return StepSpread(
        min_ms=shortest,
        median_ms=median,
        max_ms=longest,
        spread=(longest - shortest) / median if median else 0.0,
        slowest_rank=slowest,
        fastest_rank=fastest,
        arrival_spread_ms=max(arr.lag_ms.values()) if arr else 0.0,
        late_ranks=arr.late if arr else [],
        waiting_ranks=arr.waiting if arr else [],
    )


def late_arrivers(ranks: Sequence[RankSummary]) -> list[Straggler]:
    """Ranks that start their steps late while the others wait for them.

    The time lost is the rank's start lag, as far as the waiting ranks waited
    for it (their extra wait); a late start nobody waited for costs nothing.
    """
    arr = arrivals(ranks)
    if arr is None or not arr.waiting:
        return []
    timed = {r.rank: r for r in ranks if r.rank in arr.lag_ms}
    median_step = statistics.median(r.median_step_ms for r in timed.values() if r.median_step_ms is not None)
    waited = max(arr.extra_wait_ms[w] for w in arr.waiting)
    reference_wait = statistics.median(timed[w].comm_wait_ms for w in arr.waiting)
    out = []
    bar = max(STRAGGLER_MIN_EXCESS_MS, STRAGGLER_MIN_EXCESS_FRACTION * unheld_step_ms(median_step, waited))
    for rank in arr.late:
        lost = min(arr.lag_ms[rank], waited)
        if lost < bar:
            continue
        out.append(
            Straggler(
                rank=rank,
                cause="late_arrival",
                excess_ms=lost,
                excess_fraction=lost / median_step if median_step else 0.0,
                phase="other",
                phase_excess_ms=arr.lag_ms[rank],
                comm_wait_ms=timed[rank].comm_wait_ms,
                reference_comm_wait_ms=reference_wait,
            )
        )
    return out


def busy_time_stragglers(ranks: Sequence[RankSummary]) -> list[Straggler]:
    """Default straggler identification: ranks whose busy time stands out.

    Busy time is a rank's step time minus its communication wait. Each step
    is compared with the same step on the other ranks, against their low
    median (with two ranks, the faster one; with many, the typical one), so a
    single slow rank does not drag its own reference up. The extra busy time
    counts only as far as the others waited for it: in lockstep training
    they wait as long as the straggler is late, so a rank whose extra busy
    time nobody waited for (step boundaries jittering on a shared host) is
    not holding anyone back. A rank is a straggler on its *median* per-step
    excess, and only where it is busier in STRAGGLER_MIN_SLOWER_SHARE of the
    steps: one step stretched by the OS scheduler is noise, and so is a rank
    slowed for half the window by a process on its core; a rank that is
    slower step after step is not. The phase named is the non-comm phase
    whose mean exceeds the same phase's low median across ranks by the most.
    """
    timed = [r for r in ranks if r.mean_step_ms is not None and r.window == "profiler_steps"]
    if len(timed) < 2:
        return []
    excess, slower = _median_step_excess(timed)
    median_step = statistics.median(r.mean_step_ms for r in timed)
    reference = statistics.median_low(excess.values())
    reference_wait = statistics.median_low(r.comm_wait_ms for r in timed if excess[r.rank] <= reference)
    bar = max(STRAGGLER_MIN_EXCESS_MS, STRAGGLER_MIN_EXCESS_FRACTION * unheld_step_ms(median_step, max(excess.values())))
    out: list[Straggler] = []
    for r in timed:
        extra = excess[r.rank]
        if extra < bar or slower[r.rank] < STRAGGLER_MIN_SLOWER_SHARE:
            continue
        phase_excess = {
            p: r.mean_phases.get(p) - statistics.median_low(o.mean_phases.get(p) for o in timed)
            for p in PHASES
            if p != "comm"
        }
        phase = max(phase_excess, key=phase_excess.__getitem__)
        out.append(
            Straggler(
                rank=r.rank,
                excess_ms=extra,
                excess_fraction=extra / median_step if median_step else 0.0,
                phase=phase,
                phase_excess_ms=phase_excess[phase],
                comm_wait_ms=r.comm_wait_ms,
                reference_comm_wait_ms=reference_wait,
            )
        )
    return sorted(out, key=lambda s: s.rank)


def stragglers(ranks: Sequence[RankSummary]) -> list[Straggler]:
    """Default straggler identification: late arrivers and busy stragglers.

    A rank that is both is named as busy when its extra busy time is at least
    half its late-arrival loss: then the late start is its own step's work
    (an optimizer after the all-reduce delays its next step), and the phase
    says where that goes; "starts late" alone named no phase for two thirds of
    such ranks (``benchmarks/culprit.py``, optimizer). Otherwise the larger loss names it.
    """
    found = {s.rank: s for s in late_arrivers(ranks)}
    for s in busy_time_stragglers(ranks):
        late = found.get(s.rank)
        if late is None or s.excess_ms >= late.excess_ms / 2:
            found[s.rank] = s
    return [found[r] for r in sorted(found)]


def unheld_step_ms(median_step: float, held_ms: float) -> float:
    """The median step less the time every rank waited for the slowest: the bar's base.

    In lockstep every rank's step grows by what the straggler adds, so a bar
    taken as a share of the measured step rose with the fault it should catch:
    a rank 20% slower made every step 1.2x, the bar 18% of the step it used to
    be, and it went unnamed (``benchmarks/culprit.py``: recall 0.93 over
    all planted faults with the old base, 0.999 with this one).
    """
    return median_step - max(0.0, min(held_ms, median_step / 2))


def _median_step_excess(timed: Sequence[RankSummary]) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank, the median over common steps of its excess (see busy_time_stragglers), and the share of those steps
    in which it had any.

    Ranks whose traces share no step numbers (a trace cut short, say) fall
    back to comparing means (one comparison: the share is 1 where it had any).
    """
    per_step = step_excesses(timed)
    if not per_step:
        busy = {r.rank: r.mean_step_ms - r.comm_wait_ms for r in timed}
        per_step = {0: _excess(busy, {r.rank: r.comm_wait_ms for r in timed})}
    rows = per_step.values()
    return (
        {r.rank: statistics.median(row[r.rank] for row in rows) for r in timed},
        {r.rank: sum(row[r.rank] > 0 for row in rows) / len(rows) for r in timed},
    )


def step_excesses(timed: Sequence[RankSummary]) -> dict[int, dict[int, float]]:
    """For each common step (in order), each rank's extra busy time over the typical rank's, as far as the typical
    rank waited for it (see busy_time_stragglers); empty where the ranks share no step."""
    wanted = set(common_steps(timed))
    by_rank = {r.rank: {s.step: s for s in r.steps if s.step in wanted} for r in timed}
    out: dict[int, dict[int, float]] = {}
    for step in sorted(wanted):
        here = {rank: by_step[step] for rank, by_step in by_rank.items()}
        busy = {rank: s.duration_ms - wait_ms(s) for rank, s in here.items()}
        out[step] = _excess(busy, {rank: wait_ms(s) for rank, s in here.items()})
    return out


def _excess(busy: dict[int, float], wait: dict[int, float]) -> dict[int, float]:
    """Extra busy time over the typical rank's, capped at how much longer the typical rank waited."""
    reference_busy = statistics.median_low(busy.values())
    reference_wait = statistics.median_high(wait.values())
    return {rank: min(busy[rank] - reference_busy, reference_wait - wait[rank]) for rank in busy}


def wait_ms(step: StepBreakdown) -> float:
    """A step's time waiting in collectives: host-side, plus (on GPU) exposed comm kernels."""
    return step.phases.comm + (step.comm_exposed_ms or 0.0)


def blame_late_ranks(r: RankSummary, waits_ms: float) -> RankSummary:
    """``r`` with up to ``waits_ms`` per step of its collective and sync idle time moved to ``late_rank``.

    ``waits_ms`` is what this rank waits per step for late arrivers beyond the
    least-waiting rank (:func:`arrivals`): idle time
    it spent in those waits is the late rank's to fix, not its own.
    """
    if r.idle is None or waits_ms <= 0:
        return r
    steps = []
    for s in r.steps:
        row = dict(s.idle_ms)
        moved = 0.0
        for cause in ("collective", "sync"):
            take = min(row.get(cause, 0.0), waits_ms - moved)
            if take > 0:
                row[cause] -= take
                moved += take
                if row[cause] <= 1e-9:
                    del row[cause]
        if moved > 0:
            row["late_rank"] = moved
        steps.append(s.model_copy(update={"idle_ms": row}))
    names = {c.cause: {name: getattr(c, name) for name in NAMING_FIELDS} for c in r.idle.causes}
    idle = summarize([s.idle_ms for s in steps], names, r.mean_step_ms)
    return r.model_copy(update={"steps": steps, "idle": idle})
