"""Cross-rank analysis: step-time spread and straggler ranks.

In synchronous data parallelism every rank's *step time* is about the same,
because each waits for the slowest at the gradient allreduce. What differs is
how the step is spent: the straggler is *busy* (computing, loading) for longer
and *waits* in collectives the least, while the fast ranks show the difference
as communication wait. So stragglers are found from busy time
(step time minus communication wait), never from step time or comm time alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from orchestrator.analysis.models import PHASES, RankSummary, StepBreakdown, StepSpread, Straggler

__all__ = [
    "STRAGGLER_MIN_EXCESS_FRACTION",
    "STRAGGLER_MIN_EXCESS_MS",
    "StragglerImpl",
    "busy_time_stragglers",
    "common_steps",
    "step_spread",
]

# A rank is a straggler when its busy time per step exceeds the reference by
# this share of the median step time, and by at least this many milliseconds
# (so that microsecond noise on tiny steps is not called out).
STRAGGLER_MIN_EXCESS_FRACTION = 0.15
STRAGGLER_MIN_EXCESS_MS = 1.0

StragglerImpl = Callable[[Sequence[RankSummary]], list[Straggler]]
"""Pluggable straggler identification: ranks in, stragglers out (sorted by rank)."""


def common_steps(ranks: Sequence[RankSummary]) -> list[int]:
    """Step numbers present on every rank that has steps."""
    sets = [{s.step for s in r.steps} for r in ranks if r.steps]
    return sorted(set.intersection(*sets)) if sets else []


def step_spread(ranks: Sequence[RankSummary]) -> StepSpread | None:
    """How far the per-rank median step times lie apart; None with fewer than two ranks."""
    timed = [r for r in ranks if r.median_step_ms is not None]
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda r: r.median_step_ms)
    fastest = min(timed, key=lambda r: r.median_step_ms)
    median = statistics.median(r.median_step_ms for r in timed)
    return StepSpread(
        min_ms=fastest.median_step_ms,
        median_ms=median,
        max_ms=slowest.median_step_ms,
        spread=(slowest.median_step_ms - fastest.median_step_ms) / median if median else 0.0,
        slowest_rank=slowest.rank,
        fastest_rank=fastest.rank,
    )


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
    excess: one step stretched by the OS scheduler is noise, a rank that is
    slower step after step is not. The phase named is the non-comm phase
    whose mean exceeds the same phase's low median across ranks by the most.
    """
    timed = [r for r in ranks if r.mean_step_ms is not None]
    if len(timed) < 2:
        return []
    excess = _median_step_excess(timed)
    median_step = statistics.median(r.mean_step_ms for r in timed)
    reference = statistics.median_low(excess.values())
    reference_wait = statistics.median_low(r.comm_wait_ms for r in timed if excess[r.rank] <= reference)
    out: list[Straggler] = []
    for r in timed:
        extra = excess[r.rank]
        if extra < STRAGGLER_MIN_EXCESS_MS or extra < STRAGGLER_MIN_EXCESS_FRACTION * median_step:
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


def _median_step_excess(timed: Sequence[RankSummary]) -> dict[int, float]:
    """Per rank, the median over common steps of its excess (see busy_time_stragglers).

    Ranks whose traces share no step numbers (a trace cut short, say) fall
    back to comparing means.
    """
    steps = common_steps(timed)
    if not steps:
        busy = {r.rank: r.mean_step_ms - r.comm_wait_ms for r in timed}
        return _excess(busy, {r.rank: r.comm_wait_ms for r in timed})
    wanted = set(steps)
    by_rank = {r.rank: {s.step: s for s in r.steps if s.step in wanted} for r in timed}
    excesses: dict[int, list[float]] = {r.rank: [] for r in timed}
    for step in steps:
        here = {rank: by_step[step] for rank, by_step in by_rank.items()}
        busy = {rank: s.duration_ms - _wait_ms(s) for rank, s in here.items()}
        for rank, value in _excess(busy, {rank: _wait_ms(s) for rank, s in here.items()}).items():
            excesses[rank].append(value)
    return {rank: statistics.median(values) for rank, values in excesses.items()}


def _excess(busy: dict[int, float], wait: dict[int, float]) -> dict[int, float]:
    """Extra busy time over the typical rank's, capped at how much longer the typical rank waited."""
    reference_busy = statistics.median_low(busy.values())
    reference_wait = statistics.median_high(wait.values())
    return {rank: min(busy[rank] - reference_busy, reference_wait - wait[rank]) for rank in busy}


def _wait_ms(step: StepBreakdown) -> float:
    """A step's time waiting in collectives: host-side, plus (on GPU) exposed comm kernels."""
    return step.phases.comm + (step.comm_exposed_ms or 0.0)
