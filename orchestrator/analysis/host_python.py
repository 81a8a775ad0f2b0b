"""A CPU-only step that spends its time in the training loop's own Python, outside torch: a per-sample loop, a
tokenizer run in the step, numpy work, a logger.

:mod:`orchestrator.analysis.untraced` names that time from the agent's stack samples, from the step's batch on
(before it, it is the work between steps, told on its own). Without the samples it read as the model's forward (an
empty stretch before the backward pass) or the step's tail: a loop that spent 24 ms of a 27 ms step scoring tokens
in Python was told "forward 25 ms, no findings". On a device the same Python is told by the device idle time it
leaves (:mod:`orchestrator.analysis.advice`); here the host's time is the step's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.finding_base import (
    REPORT_FRACTION,
    make_finding,
    ranks_text,
    share,
    step_word,
    worst_straggler,
)
from orchestrator.analysis.gc_finding import pauses_per_step
from orchestrator.analysis.python_fix import PythonKind, python_fix, python_kind
from orchestrator.analysis.python_frames import frame_label, sampled_spot, spot_and_caller
from orchestrator.models.analysis import Finding, OpStat, RankSummary, Straggler

__all__ = ["host_python", "python_per_step"]


def host_python(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> Finding | None:
    """On a CPU-only trace, the loop's own Python takes REPORT_FRACTION of the step or more, on ranks where it is no
    straggler's own work (that the straggler finding names, with what it costs every rank)."""
    first = worst_straggler(stragglers)
    by_straggler = {first.rank} if first and own_python(first, ranks, {s.rank for s in stragglers}) else set()
    hit = [
        r for r in ranks
        if r.steps and r.gpu is None and r.idle is None and r.rank not in by_straggler and share(r, python_per_step(r)) >= REPORT_FRACTION
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda r: share(r, python_per_step(r)))
    per_step = python_per_step(worst)
    steps = sum(1 for ms in _python_ms(worst) if ms > 0)
    when = "in every step" if steps == len(worst.steps) else (
        f"in {steps} of the {len(worst.steps)} steps (a stack sample catches work shorter than the time between two "
        "samples only now and then: it may run in more)"
    )
    where = sampled_spot(worst.python_frames, worst.python_samples)
    named = f" The stack samples there: {where}." if where else ""
    figure = f"{per_step:.1f} ms a {step_word(worst)}"
    fetched = " after its batch is fetched" if worst.data_loader else ""
    found = spot_and_caller(worst.python_frames)
    who = frame_label(found[0].name) if found else "The loop's own Python"
    told = f"{who} runs in the step ({figure})"
    kind = _kind(worst.python_frames)
    what, runs = (
        ("Waiting for Ray calls", "waits in Ray's own Python (ray.get, an actor call), running no torch op,")
        if kind == "ray_call" else
        ("The loop's own Python", "runs Python outside any torch op (no frame of the model, autograd, the optimizer or the DataLoader)")
    )
    return make_finding(
        "host_python",
        worst,
        per_step,
        title=f"{what} takes {share(worst, per_step):.0%} of the {step_word(worst)}, outside torch",
        evidence=(
            f"The training thread {runs} {when} on rank {worst.rank}{fetched}, {per_step:.1f} ms of a "
            f"{worst.mean_step_ms or 0:.1f} ms {step_word(worst)} on average.{named} Found on {ranks_text(hit)}."
        ),
        fix=python_fix(kind, [f.name for f in worst.python_frames], told, worst.device, idles=False),
        ranks=[r.rank for r in hit],
    )


def _kind(path: Sequence[OpStat]) -> PythonKind:
    """What the Python is, by the innermost frame of its hot path that says (a tokenizer's list comprehension is the
    tokenizer's); a path of one frame is a line of the loop itself, whose callee the samples cannot see (a sleep, I/O,
    a C extension) or Python written inline in the loop."""
    for f in reversed(path):
        if (kind := python_kind(f.name)) != "python":
            return kind
    return "loop_line" if len(path) == 1 else "python"


def _python_ms(r: RankSummary) -> list[float]:
    """The loop's own Python in each step (StepBreakdown.python_ms) less the garbage collector's pauses in it: a
    collection called from the loop's line, or started by one of its allocations, is the collector's finding's, and
    a stack sample taken as the pause ends names the loop's line (or, in a Ray worker, the watch's callback)."""
    return [max(0.0, s.python_ms - pause) for s, pause in zip(r.steps, pauses_per_step(r))]


def python_per_step(r: RankSummary) -> float:
    """The loop's own Python, ms per step, less the collector's pauses (:func:`_python_ms`)."""
    return sum(_python_ms(r)) / len(r.steps) if r.steps else 0.0


def own_python(worst: Straggler, ranks: Sequence[RankSummary], slow: set[int]) -> tuple[float, str, str] | None:
    """Where the stack samples put a straggler's extra 'other' time: the loop's own Python it runs beyond the other
    ranks' (``slow``: the stragglers) (ms per step; at least half that phase's excess), where its samples go, and
    the function there; None where they do not say. The straggler finding tells that Python, not this module's."""
    if worst.phase != "other" or worst.cause != "busy":
        return None
    r = next((x for x in ranks if x.rank == worst.rank), None)
    others = [python_per_step(x) for x in ranks if x.rank not in slow]
    if r is None or not others:
        return None
    extra = python_per_step(r) - statistics.median(others)
    where = sampled_spot(r.python_frames, r.python_samples)
    found = spot_and_caller(r.python_frames)
    if extra < worst.phase_excess_ms / 2 or not where or found is None:
        return None
    return extra, where, frame_label(found[0].name)

