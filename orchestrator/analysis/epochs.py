"""A DataLoader that starts its worker processes again at every epoch.

Without ``persistent_workers=True`` a DataLoader with workers shuts them down when an epoch's batches are spent
and starts new ones for the next epoch: the step that begins an epoch first reads the spent iterator once more
(the read that ends the epoch: it joins the old workers), then waits while new processes start (fork or spawn,
the dataset pickled to each), then waits for their first batch, and the new processes compete for the host's
cores while the step runs. On a short epoch that is paid every few steps: three batches an epoch on two workers
made the epoch's first step 8x the median (``tests/data/traces/cpu_loader_restart``); with persistent workers the
same loop's epochs begin at the median step's pace (``cpu_loader_persistent``). The transformers Trainer's default
is ``dataloader_persistent_workers=False``.

Told from the trace alone: almost no torch op before the step's own batch but the new iterator's seed draw, and at
most the one read that ends the epoch (:func:`~orchestrator.analysis.between.ends_epoch`; Lightning reads a batch
ahead, so that read falls in the step before), and the loader's reads are those of worker processes. Lightning's
loop with two workers on three batches an epoch spent 97-197 ms of such steps before the batch. The cost
is each such step's excess over the other steps' median; the window's share of it, per step, is the bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.between import RECURRING_FLOOR, restarts_workers
from orchestrator.analysis.finding_base import REPORT_FRACTION, OneStep, make_finding
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.models.analysis import Finding, RankSummary, StepBreakdown, Straggler

__all__ = ["epoch_starts", "loader_restart"]


def epoch_starts(r: RankSummary) -> list[StepBreakdown]:
    """The steps of ``r`` where its loader's workers start again, as far as each spends at least RECURRING_FLOOR of
    the other steps' median step before its own batch (a persistent loader's epoch starts in well under a
    millisecond); at most half the steps (else no step is typical)."""
    starts = [s for s in r.steps if restarts_workers(r, s)]
    if not starts or 2 * len(starts) > len(r.steps):
        return []
    typical = statistics.median(s.duration_ms for s in r.steps if s not in starts)
    return [s for s in starts if s.between_ms >= RECURRING_FLOOR * typical]


def _period(starts: Sequence[StepBreakdown]) -> int | None:
    """Steps from one epoch's start to the next where the window holds two or more, evenly apart; else None."""
    gaps = {b.step - a.step for a, b in zip(starts, starts[1:])}
    return gaps.pop() if len(gaps) == 1 else None


def loader_restart(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Steps that begin an epoch start the loader's worker processes again, at a cost the window measures."""
    hits = [(r, starts) for r in ranks if (starts := epoch_starts(r))]
    if not hits:
        return None
    r, starts = max(hits, key=lambda h: sum(s.duration_ms for s in h[1]))
    typical = statistics.median(s.duration_ms for s in r.steps if s not in starts)
    costs = [max(0.0, s.duration_ms - typical) for s in starts]
    per_step = sum(costs) / len(r.steps)
    if per_step < REPORT_FRACTION * typical:
        return None
    numbers = [str(s.step) for s in starts]
    labels = numbers[0] if len(numbers) == 1 else ", ".join(numbers[:-1]) + " and " + numbers[-1]
    heads = [s.between_ms for s in starts]
    many = len(starts) > 1
    # A summary from before seed draws were counted shows the read that ends the epoch instead.
    drawn = "a new iterator's seed draw and almost no other torch op" if all(s.between_seeds for s in starts) else (
        "one more read, the one that ends an epoch, and almost no torch op"
    )
    evidence = (
        f"Step{'s' if many else ''} {labels} begin{'' if many else 's'} a new epoch of the DataLoader: {drawn} in the "
        f"{_span(heads)} ms before "
        f"{'their' if many else 'its'} own batch; {'they take' if many else 'it takes'} {_span([s.duration_ms for s in starts])} "
        f"ms against a {typical:.1f} ms median step. The loader reads through worker processes: without "
        "persistent_workers=True it shuts them down when an epoch ends and starts new ones, which load their first "
        "batches from scratch."
    )
    period = _period(starts)
    one_off = None
    if period is not None:
        evidence += f" An epoch here is {period} steps: the restarts cost {per_step:.1f} ms a step."
    elif not many:
        one_off = OneStep(step=starts[0].step, ms=costs[0], fraction=1.0, others_ms=0.0, others=len(r.steps) - 1)
    fix = (
        "Keep the workers across epochs: DataLoader(..., persistent_workers=True) (what a worker holds, open files "
        "and a dataset's caches, lives on too); each epoch's first batch then waits only for the read-ahead to refill. "
        "Fewer, longer epochs (a larger dataset per epoch, or an infinite sampler) pay it less often."
        + in_loop(r.loop, [Change.PERSISTENT_WORKERS])
    )
    same = [h[0].rank for h in hits]
    return make_finding(
        "loader_restart",
        r,
        per_step,
        title="The DataLoader starts its worker processes again at every epoch",
        evidence=evidence,
        fix=fix,
        ranks=same,
        one_off=one_off,
    )


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"
