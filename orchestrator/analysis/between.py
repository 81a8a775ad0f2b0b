"""Work the loop does between steps: what runs before a step fetches its batch (``StepBreakdown.between_ms``).

A training loop saves checkpoints, evaluates and logs every so many steps, after one optimizer step and before
the next batch is fetched (a transformers ``Trainer`` after ``save_steps`` / ``eval_steps`` / ``logging_steps``,
Lightning's ``ModelCheckpoint`` and validation). A window that holds such a step reads a step many times its
median, and every mean over the window carries it: the report says which step it is and what runs there, rather
than count it as every step's cost. It is not a fix of its own: how often it recurs is the loop's setting, which
the trace cannot see. (Where most of a window's steps evaluate, it can: :mod:`orchestrator.analysis.evaluations`.)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.finding_base import ONE_STEP_OTHERS_FRACTION, REPORT_FRACTION, OneStep, one_step, ranks_text
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.python_frames import sampled_spot
from orchestrator.models.analysis import RankSummary, StepBreakdown

__all__ = [
    "BETWEEN_FRACTION", "MOSTLY", "RECURRING_FLOOR", "WORKER_LOADER", "between_note", "between_steps", "ends_epoch", "lifted", "periodic_text",
    "periodic_work", "recurring_steps", "restarts_workers",
]

# One step's work before its batch is told when it reaches this share of the other steps' median step time.
BETWEEN_FRACTION = 0.5
# A cost is mostly the work before the batch when that work is at least this share of it.
MOSTLY = 0.5
# Work before the batch in two or more steps is told from this share of the median step in each step that does
# it, where the window's total of it is at least REPORT_FRACTION of the median step a step.
RECURRING_FLOOR = 0.1
# Work before the batch is the host's own (Python, file I/O) where torch ops run less than this share of it.
OPS_FEW = 0.1
_KINDS = "a checkpoint save, an evaluation, logging"
# The iterator of a DataLoader with worker processes (num_workers > 0), as its reads are named in a trace.
WORKER_LOADER = "_MultiProcessingDataLoaderIter"


def ends_epoch(s: StepBreakdown) -> bool:
    """Whether ``s`` begins a new epoch of its DataLoader: almost no torch op before its own batch, a new
    iterator's seed draw among them, and at most one read (the one that finds the epoch's batches spent; a loop
    that reads one batch ahead, as Lightning's does, read it in the step before). An evaluation reads its own
    batches and runs the model on them; a checkpoint save draws no seed. A summary from before seed draws were
    counted has only the one read to go by."""
    if s.between_ops_ms is None or s.between_ops_ms >= OPS_FEW * s.between_ms:
        return False
    return s.between_fetches <= 1 and s.between_seeds > 0 if s.between_seeds is not None else s.between_fetches == 1


def _epoch_start(s: StepBreakdown) -> str:
    """What the trace shows of a new epoch's start before the step's batch, in words."""
    drawn = "a new iterator's seed draw" if s.between_seeds else "one more read, the one that ends an epoch,"
    return f"{drawn} and only {s.between_ops_ms or 0.0:.1f} ms of torch ops in the {s.between_ms:.1f} ms before its batch"


def restarts_workers(r: RankSummary, s: StepBreakdown) -> bool:
    """Whether ``s`` of ``r`` begins an epoch of a DataLoader with worker processes: where persistent_workers is off,
    the workers of the spent epoch are shut down there and new ones started (:mod:`orchestrator.analysis.epochs`)."""
    return r.data_loader == WORKER_LOADER and ends_epoch(s)


def between_steps(r: RankSummary) -> OneStep | None:
    """The step of ``r`` that alone does work before fetching its batch, worth telling; else None. A step where a
    loader's workers start again is the loader-restart finding's, not this note's."""
    found = one_step(r, [0.0 if restarts_workers(r, s) else s.between_ms for s in r.steps])
    if found is None:
        return None
    others = statistics.median(s.duration_ms for s in r.steps if s.step != found.step)
    return found if found.ms >= BETWEEN_FRACTION * others else None


def periodic_work(r: RankSummary, when: OneStep) -> bool:
    """Whether most of a one-off cost ``when`` (idle time one step holds) is the loop's work before that step's batch."""
    return any(s.step == when.step and s.between_ms >= MOSTLY * when.ms for s in r.steps)


def periodic_text(r: RankSummary, step: int) -> str:
    """What such work is in ``step`` of ``r``, as far as its trace tells, and the settings that say how often it runs
    in ``r``'s loop."""
    return f"work the loop does every so many steps ({_kind(r, step)}), not each step's." + in_loop(
        r.loop, [Change.BETWEEN_STEPS]
    )


def _kind(r: RankSummary, step: int) -> str:
    """What the trace tells of that work, and where the agent's stack samples found it."""
    s = next(s for s in r.steps if s.step == step)
    return _guess(s) + _sampled(s)


def _sampled(s: StepBreakdown) -> str:
    """'; the stack samples there: 83% in save_file (safetensors/torch.py:286), called from ...' ('' without)."""
    where = sampled_spot(s.between_frames, s.between_samples)
    return f"; the stack samples there: {where}" if where else ""


def _guess(s: StepBreakdown) -> str:
    """An evaluation where the work fetches batches of its own; the host's own code (a save's file writes, a
    logger's network calls) where it runs almost no torch ops; else the kinds it may be."""
    if ends_epoch(s):
        return f"most likely the DataLoader starting a new epoch: {_epoch_start(s)} (its sampler, its dataset's own start)"
    if s.between_fetches and s.between_ops_ms is not None:
        return (
            f"most likely an evaluation: it reads a DataLoader {s.between_fetches} time{'s' if s.between_fetches > 1 else ''}"
            f" before the step's own batch and runs {s.between_ops_ms:.1f} ms of torch ops; "
            f"{s.between_ms - s.between_ops_ms:.1f} ms is Python and I/O"
        )
    if s.between_ops_ms is not None and s.between_ops_ms < OPS_FEW * s.between_ms:
        return (
            f"most likely a checkpoint save writing its files, or a logger's network calls: torch ops run only "
            f"{s.between_ops_ms:.1f} ms of it, the rest is Python and I/O"
        )
    return _KINDS


def recurring_steps(r: RankSummary) -> list[StepBreakdown]:
    """The steps of ``r`` that do work before fetching their batch where two or more do (at most half the steps):
    each at least RECURRING_FLOOR of the median step, the other steps' own such work under ONE_STEP_OTHERS_FRACTION
    of the least of theirs, and the window's total at least REPORT_FRACTION of the median step a step; else none.
    Three evaluations in a window are no one step's cost, and were told nowhere. A step where a loader's workers
    start again is the loader-restart finding's."""
    if len(r.steps) < 3:
        return []
    typical = statistics.median(s.duration_ms for s in r.steps)
    hits = [s for s in r.steps if s.between_ms >= RECURRING_FLOOR * typical and not restarts_workers(r, s)]
    if len(hits) < 2 or 2 * len(hits) > len(r.steps):
        return []
    rest = statistics.median(s.between_ms for s in r.steps if s not in hits)
    if rest > ONE_STEP_OTHERS_FRACTION * min(s.between_ms for s in hits):
        return []
    return hits if sum(s.between_ms for s in hits) / len(r.steps) >= REPORT_FRACTION * typical else []


def between_note(ranks: Sequence[RankSummary]) -> str | None:
    """A note on the step (or the steps) whose work before the batch stands out, on the ranks where it does; None
    where none does."""
    found = [(r, w) for r in ranks if (w := between_steps(r)) is not None]
    if found:
        r, when = max(found, key=lambda f: f[1].ms)
        alike = [f[0] for f in found if f[1].step == when.step]
        return (
            f"{when.label(r)} spends {when.ms:.1f} ms on {ranks_text(alike)} before it fetches its batch (the other "
            f"{when.others} steps {when.others_ms:.1f} ms, median), outside the step's own phases (counted as 'other'): "
            f"{periodic_text(r, when.step)}{lifted(r)} Recurring every N steps, it costs {when.ms:.1f}/N ms a step."
        )
    many = [(r, hits) for r in ranks if (hits := recurring_steps(r))]
    if not many:
        return None
    r, hits = max(many, key=lambda m: sum(s.between_ms for s in m[1]))
    numbers = [h.step for h in hits]
    alike = [m[0] for m in many if [h.step for h in m[1]] == numbers]
    gaps = {b - a for a, b in zip(numbers, numbers[1:])}
    # Steps one after the other are a run of slow steps, no period ("every 1 steps" beside steps that do no such work).
    period = gaps.pop() if len(gaps) == 1 and min(gaps) > 1 else None
    rest = [s.between_ms for s in r.steps if s not in hits]
    heads = [h.between_ms for h in hits]
    cost = sum(heads) / len(r.steps)
    named = ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
    largest = max(hits, key=lambda h: h.between_ms)
    rate = (
        f" Every {period} steps, it costs {cost:.1f} ms a step." if period
        else f" At this window's rate, it costs {cost:.1f} ms a step."
    )
    return (
        f"steps {named}{f' (every {period} steps)' if period else ''} spend "
        f"{min(heads):.1f}-{max(heads):.1f} ms on {ranks_text(alike)} before they fetch their batch (the other "
        f"{len(rest)} steps {statistics.median(rest):.1f} ms, median), outside the steps' own phases (counted as "
        f"'other'): {periodic_text(r, largest.step)}{lifted(r)}{rate}"
    )


def lifted(r: RankSummary) -> str:
    """' It lifts the mean step to X ms against a Y ms median.' where a few steps' cost does ('' where it does not)."""
    mean, median = r.mean_step_ms or 0.0, r.median_step_ms or 0.0
    return f" It lifts the mean step to {mean:.1f} ms against a {median:.1f} ms median." if mean > 1.1 * median else ""
