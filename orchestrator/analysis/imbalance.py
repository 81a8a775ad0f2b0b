"""Imbalance that moves between ranks: every step waits for its own slowest rank, a different one each step.

A straggler (:func:`~orchestrator.analysis.cross.busy_time_stragglers`) is busier step after step, named on its
median excess. When the work per batch varies (sequence lengths, image sizes, a data-dependent path), a different
rank is the slowest in each step: at the median no rank stands out, yet in lockstep each step lasts as long as its
slowest rank's work and the others wait for it in the step's collectives. A two-rank DDP job on batches of 16 to
400 tokens lost 67 ms of its 150 ms step that way (``tests/data/traces/cpu_ddp_varlen``); the straggler rule saw
at most the rank that drew more long batches in the window (another recording of the same loop: nothing at all).

What it costs is measured per step: the slowest rank's excess over the typical rank, as far as the others waited
for it (:func:`~orchestrator.analysis.cross.step_excesses`), averaged over the steps. The part of it that *moves*
is that average less the largest median excess of any rank, the share a straggler is named on: a lasting
straggler's loss is its own (it moves nothing), a shared host's jitter moves only a few percent of the step (the
recorded two-rank CPU jobs here, 9% at most; ``benchmarks/culprit.py``'s planted sets of up to 256 ranks, 5% at most).
It is told when the moving part reaches a straggler's bar beyond what the ranks' threads wait for a core
(:func:`~orchestrator.analysis.cpu_wait.core_wait_ms`): the scheduler holds a different rank back each step with the
same work on every rank (the live healthy job beside Ray's processes on two cores: 4-7 ms of a 28-35 ms step moved,
its threads off a core 3.7-4.1 ms a step while working; 31-96 ms moved beside a test run, off a core 116-450 ms).
On CPU ranks a step's excess must also be the work's: its forward and backward grow together (:func:`_confirmed`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.analysis.cpu_wait import core_wait_ms
from orchestrator.analysis.cross import (
    STRAGGLER_MIN_EXCESS_FRACTION,
    STRAGGLER_MIN_EXCESS_MS,
    common_steps,
    step_excesses,
    unheld_step_ms,
    wait_ms,
)
from orchestrator.analysis.finding_base import make_finding
from orchestrator.analysis.gc_finding import explains_imbalance
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.models.analysis import PHASES, Finding, RankSummary, StepBreakdown, Straggler

__all__ = ["IMBALANCE_MIN_STEPS", "Imbalance", "imbalance", "moving_imbalance"]

# Steps the ranks must share: with two ranks, a different one slowest in two of three steps is as likely chance.
IMBALANCE_MIN_STEPS = 4


@dataclass(frozen=True)
class Imbalance:
    """What the ranks lose, per step, waiting for each step's slowest rank."""

    lost_ms: float
    """Mean over the steps of the slowest rank's excess the others waited for."""
    lasting_ms: float
    """The largest median excess of any rank: what a straggler is named on (a rank slower step after step), which
    does not move."""
    balanced_ms: float
    """What equal work per rank would win a step: the slowest rank's busy time over the ranks' mean, as far as the
    others waited for it (half the wait with two ranks)."""
    slowest: dict[int, int]
    """Rank -> the steps in which it was the slowest."""
    phase: str
    """The phase in which the slowest ranks spend most of their excess."""
    phase_ms: float
    busy_ms: tuple[float, float]
    """The least and the most busy time (step less collective wait) of any rank in any of the steps."""
    median_step_ms: float
    steps: int

    work_moving_ms: float
    """What moves of the ranks' work: the same, counting a rank's excess in a step as far as both its forward and its
    backward grew (and its data loading), on ranks that compute on the CPU; ``moving_ms`` elsewhere."""

    @property
    def moving_ms(self) -> float:
        return self.lost_ms - self.lasting_ms


def imbalance(ranks: Sequence[RankSummary]) -> Imbalance | None:
    """The per-step imbalance of the ranks' common steps; None with fewer than two ranks or IMBALANCE_MIN_STEPS steps."""
    timed = [r for r in ranks if r.steps and r.window == "profiler_steps" and r.median_step_ms is not None]
    if len(timed) < 2 or len(common_steps(timed)) < IMBALANCE_MIN_STEPS:
        return None
    excess = step_excesses(timed)
    by_rank = {r.rank: {s.step: s for s in r.steps} for r in timed}
    slowest: dict[int, int] = {}
    phase_ms = dict.fromkeys(PHASES, 0.0)
    for step, row in excess.items():
        rank = max(row, key=lambda k: (row[k], -k))
        if row[rank] <= 0:
            continue
        slowest[rank] = slowest.get(rank, 0) + 1
        for p in PHASES:
            if p != "comm":
                phase_ms[p] += by_rank[rank][step].phases.get(p) - statistics.median_low(
                    b[step].phases.get(p) for b in by_rank.values()
                )
    phase = max((p for p in PHASES if p != "comm"), key=phase_ms.__getitem__)
    busy = {step: [b[step].duration_ms - wait_ms(b[step]) for b in by_rank.values()] for step in excess}
    n = len(excess)
    lost, lasting = _lost_and_lasting(excess, timed)
    confirmed = _confirmed(excess, by_rank) if all(r.device == "cpu" for r in timed) else None
    worked = _lost_and_lasting(confirmed, timed) if confirmed is not None else (lost, lasting)
    return Imbalance(
        lost_ms=lost,
        balanced_ms=sum(
            max(0.0, min(max(row.values()), max(busy[step]) - statistics.fmean(busy[step]))) for step, row in excess.items()
        ) / n,
        lasting_ms=lasting,
        slowest=dict(sorted(slowest.items(), key=lambda kv: (-kv[1], kv[0]))),
        phase=phase,
        phase_ms=phase_ms[phase] / n,
        busy_ms=(min(min(b) for b in busy.values()), max(max(b) for b in busy.values())),
        median_step_ms=statistics.median(r.median_step_ms for r in timed if r.median_step_ms is not None),
        steps=n,
        work_moving_ms=worked[0] - worked[1],
    )


def _lost_and_lasting(excess: dict[int, dict[int, float]], timed: Sequence[RankSummary]) -> tuple[float, float]:
    """The mean over the steps of the slowest rank's excess, and the largest median excess of any rank."""
    return (
        sum(max(0.0, max(row.values())) for row in excess.values()) / len(excess),
        max(statistics.median(max(0.0, row[r.rank]) for row in excess.values()) for r in timed),
    )


def _confirmed(
    excess: dict[int, dict[int, float]], by_rank: dict[int, dict[int, StepBreakdown]]
) -> dict[int, dict[int, float]]:
    """Each rank's excess in each step as far as its work grew: a larger batch grows the forward and the backward
    together (the backward differentiates the ops the forward ran), so the part of the compute excess both confirm,
    their smaller growth over the typical rank's, plus any extra time loading its batch. On a CPU rank a step's
    phases are its work; a hiccup lands in one of them (one convolution 10 ms slower than its 0.9 ms in every other
    call, on the healthy example job beside bursts of other processes). A step without both phases counts in full."""
    out: dict[int, dict[int, float]] = {}
    for step, row in excess.items():
        typical = {
            p: statistics.median_low(b[step].phases.get(p) for b in by_rank.values()) for p in ("data", "forward", "backward")
        }
        out[step] = {}
        for rank, ms in row.items():
            phases = by_rank[rank][step].phases
            if ms <= 0 or typical["forward"] <= 0 or typical["backward"] <= 0:
                out[step][rank] = ms
                continue
            growth = min(phases.forward / typical["forward"], phases.backward / typical["backward"]) - 1
            grew = max(0.0, growth) * (typical["forward"] + typical["backward"]) + max(0.0, phases.data - typical["data"])
            out[step][rank] = min(ms, grew)
    return out


_FIXES = {
    "model": "Give every rank the same work per step, not the same number of samples: its batches differ in size "
    "(sequence lengths, image sizes, objects per image) or take data-dependent paths (an MoE's routing, early exits). "
    "Pack sequences into batches of a fixed number of tokens, or put samples of similar length into the same step on "
    "every rank (a length-grouped sampler); padding every batch to one length also balances them, at the cost of the "
    "padded compute. Profile with record_shapes=True to see each step's input sizes in the merged trace.",
    "data": "Some batches take much longer to load than others (samples of uneven cost to read or decode), on a "
    "different rank each step: with more DataLoader workers and a larger prefetch_factor, loading runs ahead of the "
    "step and its uneven cost is hidden.",
}


def moving_imbalance(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """A different rank is the slowest in each step and the others wait for it, at a straggler's cost."""
    found = imbalance(ranks)
    if found is None:
        return None
    bar = max(STRAGGLER_MIN_EXCESS_MS, STRAGGLER_MIN_EXCESS_FRACTION * unheld_step_ms(found.median_step_ms, found.lost_ms))
    if min(found.moving_ms, found.work_moving_ms) - core_wait_ms(ranks) < bar or len(found.slowest) < 2 or explains_imbalance(found.lost_ms, ranks):
        return None  # nothing moves, or no more than the scheduler or a hiccup moves, or the collector's pauses (their own finding)
    turns = ", ".join(f"rank {k} in {n}" for k, n in found.slowest.items())
    kind = "model" if found.phase in ("forward", "backward") else found.phase
    fix = _FIXES.get(
        kind,
        f"Compare the {found.phase} spans of a step's slowest rank with another rank's in the merged trace: work that "
        "lands on a different rank each step (rank-rotating logging or metrics, a host shared with other jobs) holds "
        "every rank back.",
    )
    if kind == "model":
        fix += in_loop(ranks[0].loop, [Change.BALANCE_LENGTHS])
    anchor = max(ranks, key=lambda r: r.mean_step_ms or 0.0)
    return make_finding(
        "imbalance",
        anchor,
        found.balanced_ms,
        title="A different rank is the slowest in each step, and every step waits for it",
        evidence=(
            f"In each of the {found.steps} steps the other ranks wait for that step's slowest rank: "
            f"{found.lost_ms:.1f} ms a step on average, and no rank is the slowest throughout ({turns} of the steps). "
            f"The slowest rank's extra time is mostly {found.phase} ({found.phase_ms:.1f} ms a step), and a rank's busy "
            f"time ranges from {found.busy_ms[0]:.1f} to {found.busy_ms[1]:.1f} ms across the steps: the work differs "
            "from batch to batch."
        ),
        fix=fix,
        ranks=sorted(found.slowest),
    )
