"""An evaluation before most steps' batches: the loop evaluates so often that it is every step's cost.

A loop evaluates every so many steps, after an optimizer step and before the next batch (transformers' Trainer after
``eval_steps``, Lightning's ``val_check_interval``). Where a window holds one such step, or a few, the report's note
says which (:func:`~orchestrator.analysis.between.between_note`): how often it recurs is the loop's setting, which the
trace cannot see. Where more than half the window's steps evaluate, it can: the setting is to evaluate (nearly) every
step, and that evaluation is the steps' largest cost, a change worth a finding of its own. The agent's stack samples
(or with_stack frames) in the work before the batch name it an evaluation: a function of
:data:`~orchestrator.analysis.python_frames.EVALUATION` on its hot path.

Recorded: sentence-transformers 6.2's trainer, unmodified, with an EmbeddingSimilarityEvaluator and ``eval_steps=1``
(``tests/data/record_cpu_sentence_transformers.py``): 80% of the time was the evaluation (measured unprofiled), and
the report said "No warning": the steps' work before their batch was counted as "other", no note told it (a note
needs at most half the steps), no finding named it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.between import RECURRING_FLOOR, restarts_workers
from orchestrator.analysis.finding_base import make_finding, ranks_text, step_word
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.python_frames import EVALUATION, frame_function, frame_label, sampled_spot
from orchestrator.models.analysis import Finding, RankSummary, StepBreakdown, Straggler

__all__ = ["evaluation", "evaluating_steps"]

_FIX = (
    "Evaluate less often (every few hundred steps, or once an epoch) and on part of the evaluation data where it is "
    "large: an evaluation before every step's batch costs the training its full time each step."
)


def _evaluation_frame(s: StepBreakdown) -> str | None:
    """The outermost frame of an evaluation's function on the stack samples' hot path in ``s``'s work before its
    batch; None where the path goes through none."""
    return next((f.name for f in s.between_frames if frame_function(f.name) in EVALUATION), None)


def evaluating_steps(r: RankSummary) -> list[StepBreakdown]:
    """The steps of ``r`` that evaluate before fetching their batch, where more than half of its steps (two or more)
    do, each for at least RECURRING_FLOOR of the median step; else none (a few are the between-steps note's). A step
    where a loader's workers start again is the loader-restart finding's."""
    if len(r.steps) < 2:
        return []
    typical = statistics.median(s.duration_ms for s in r.steps)
    hits = [s for s in r.steps if s.between_ms >= RECURRING_FLOOR * typical and not restarts_workers(r, s) and _evaluation_frame(s)]
    return hits if 2 * len(hits) > len(r.steps) else []


def evaluation(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Some rank evaluates before most of its steps' batches."""
    found = [(r, hits) for r in ranks if r.mean_step_ms and (hits := evaluating_steps(r))]
    if not found:
        return None
    r, hits = max(found, key=lambda f: sum(s.between_ms for s in f[1]) / len(f[0].steps))
    ms = sum(s.between_ms for s in hits) / len(r.steps)
    largest = max(hits, key=lambda s: s.between_ms)
    evaluates = frame_label(_evaluation_frame(largest) or "")
    where = sampled_spot(largest.between_frames, largest.between_samples)
    every = len(hits) == len(r.steps)
    word = step_word(r)
    return make_finding(
        "evaluation",
        r,
        ms,
        title=(f"An evaluation runs before every {word}'s batch" if every else f"An evaluation runs before {len(hits)} of "
               f"the {len(r.steps)} {word}s' batches") + f": {ms / (r.mean_step_ms or ms):.0%} of the {word}",
        evidence=(
            f"{len(hits)} of the {len(r.steps)} steps on rank {r.rank} run {evaluates} before they fetch their batch "
            f"({min(s.between_ms for s in hits):.1f}-{largest.between_ms:.1f} ms each"
            + (f"; the stack samples there: {where}" if where else "")
            + f"), outside the steps' own phases (counted as 'other'): {ms:.1f} ms of the {r.mean_step_ms or 0:.1f} ms "
            f"{word}" + (f" (found on {ranks_text([f[0] for f in found])})" if len(found) > 1 else "")
            + ". How often the loop evaluates is its setting: here, "
            + ("every step." if every else "in most steps of the window.")
        ),
        fix=_FIX + in_loop(r.loop, [Change.EVALUATE_LESS_OFTEN]),
        ranks=[f[0].rank for f in found],
    )
