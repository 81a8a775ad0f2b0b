"""Autograd's anomaly detection left on in a training loop, told from the NaN check it runs after every backward node.

``torch.autograd.set_detect_anomaly(True)`` (the ``detect_anomaly()`` context, Lightning's
``Trainer(detect_anomaly=True)``) is a debugging aid with two costs. The autograd engine checks every output of every
backward node for NaN (engine.cpp's ``call_function``: ``isnan(output)._is_any_true().item()``), a read of a device
value each time, which on a GPU waits for every kernel queued before it; and every op that records a gradient function
in forward formats a Python traceback for it (``torch/fx/traceback.py``'s ``format_stack``). A trace shows the check
as those three ops directly inside an ``autograd::engine::evaluate_function: ...`` span, where nothing else runs them;
the tracebacks are time inside forward's ops that only the Python stack (the agent's samples, or ``with_stack``) shows.

Two gloo ranks of a six-block MLP under DDP (``tests/data/record_cpu_debug.py``): 70 ms a step with it on, 53 ms off;
backward 9 ms longer (the checks: 12 ms), forward 7 ms longer (the tracebacks: 2 ms by the agent's stack samples).
On a CPU-only trace the finding's figure is therefore what turning it off saves at least. Its reads are no sync of the loop's own (:mod:`orchestrator.analysis.rank` leaves them out of the sync phase): no line of the
job's code makes them. Not told: ``detect_anomaly(check_nan=False)``, which runs no check (its tracebacks alone leave
nothing in a trace that is theirs for sure). On a device a step's bound is at most the device's idle time in that step,
as every host cost's; the idle time in the checks and in the gaps after their reads is their own cause (``anomaly``,
:mod:`orchestrator.analysis.idle`). An H200 CNN under ``detect_anomaly()`` was told 4.1 ms a step; turning it off saved
4.2 ms (benchmarks/results/gpu-h200-run5.json).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence

from orchestrator.analysis.autograd_nodes import Nodes
from orchestrator.analysis.finding_base import make_finding, one_step, ranks_text, step_word
from orchestrator.analysis.intervals import clip, total, union
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.python_frames import frame_parts
from orchestrator.analysis.spans import Kinds
from orchestrator.analysis.untraced import Timeline
from orchestrator.models.analysis import Finding, RankSummary, Straggler
from orchestrator.models.anomaly import AnomalyChecks
from orchestrator.traces.loader import Span

__all__ = ["NanCheck", "alone", "anomaly_mode", "nan_checks", "step_checks", "traceback_ms"]

_ISNAN, _ANY, _READ = ("aten::isnan", "cpu_op"), ("aten::_is_any_true", "cpu_op"), ("aten::item", "cpu_op")
_TRACEBACK = ("torch/fx/traceback.py", "format_stack")  # what anomaly mode calls for each gradient function it records

NanCheck = tuple[Span, Span, Span]  # one check: its aten::isnan, aten::_is_any_true and aten::item


def nan_checks(threads: Iterable[Kinds]) -> list[NanCheck]:
    """The engine's NaN checks on the threads of one process (each thread's spans by kind): an ``aten::_is_any_true``
    inside a backward node with the ``aten::isnan`` before it and the ``aten::item`` after it in the same node."""
    found: list[NanCheck] = []
    for kinds in threads:
        anys = kinds.get(_ANY)
        if not anys:
            continue  # the common case: one lookup a thread
        nodes = Nodes(kinds)
        isnans = sorted(kinds.get(_ISNAN, ()), key=lambda s: s.end)  # these ops do not nest in one another
        reads = sorted(kinds.get(_READ, ()), key=lambda s: s.ts)
        isnan_ends, read_starts = [s.end for s in isnans], [s.ts for s in reads]
        for check in anys:
            node = nodes.holding(check)
            i, j = bisect.bisect_right(isnan_ends, check.ts), bisect.bisect_left(read_starts, check.end)
            if node is None or not i or j == len(reads):
                continue
            before, after = isnans[i - 1], reads[j]
            if node.ts <= before.ts and after.end <= node.end:
                found.append((before, check, after))
    return found


def step_checks(
    checks: Sequence[NanCheck], windows: Sequence[tuple[float, float]], frames: Sequence[Span], timeline: Timeline | None
) -> list[AnomalyChecks | None]:
    """Each window's checks that start in it (their time from each isnan's start to its read's end) and its tracebacks
    (:func:`_traceback_ms`, from the main thread's ``frames`` or the ``timeline``'s samples); None for a window
    without a check, every window's where there is none (no trace is read twice for them)."""
    if not checks:
        return [None] * len(windows)
    out: list[AnomalyChecks | None] = []
    for (t0, t1), traced in zip(windows, _traceback_ms(frames, timeline, windows)):
        inside = [(a, c) for a, _, c in checks if t0 <= a.ts < t1]
        out.append(AnomalyChecks(
            checks=len(inside), check_ms=sum(c.end - a.ts for a, c in inside) / 1000, traceback_ms=traced,
            tracebacks_whole=bool(frames),
        ) if inside else None)
    return out


def _traceback_ms(frames: Sequence[Span], timeline: Timeline | None, windows: Sequence[tuple[float, float]]) -> list[float]:
    """Each window's time in anomaly mode's tracebacks: ``with_stack`` frames of ``format_stack`` (nested ones once),
    else the agent's samples whose stack holds it, each worth the sampling interval."""
    if frames:
        held = union((f.ts, f.end) for f in frames if frame_parts(f.name) == _TRACEBACK)
        return [total(clip(held, t0, t1)) / 1000 for t0, t1 in windows]
    if timeline is None:
        return [0.0] * len(windows)
    return [
        timeline.interval_ms * sum(any(frame_parts(f) == _TRACEBACK for f in timeline.stacks[i]) for i in timeline.within(t0, t1))
        for t0, t1 in windows
    ]


def _cost(r: RankSummary) -> list[float]:
    """Each step's cost of anomaly mode: its checks and tracebacks. On a device, the checks' idle time (the idle cause
    ``anomaly``: a check while the device runs queued work costs nothing) and the tracebacks, at most the step's idle
    time: on an H200 the checks' host time (2.4 ms a step) held 1.0 ms that the device spent busy, which the
    utilization finding's bound held too."""
    if r.idle is None:
        return [s.anomaly.check_ms + s.anomaly.traceback_ms if s.anomaly else 0.0 for s in r.steps]
    return [
        min(s.idle_ms.get("anomaly", 0.0) + s.anomaly.traceback_ms, sum(s.idle_ms.values())) if s.anomaly else 0.0
        for s in r.steps
    ]


def traceback_ms(r: RankSummary) -> float:
    """Forward's tracebacks a step (the agent's samples or with_stack): time inside the model's ops, which the device
    idle attribution gives to the host's ops (``cpu``) and this finding claims; the utilization finding leaves it out,
    as it leaves out the checks' own idle cause (``anomaly``)."""
    return statistics.fmean(s.anomaly.traceback_ms if s.anomaly else 0.0 for s in r.steps) if r.steps else 0.0


def alone(rank: int, ranks: Sequence[RankSummary]) -> tuple[float, float] | None:
    """Where ``rank`` runs anomaly detection and some other rank does not (a rank-gated debugging aid: the others wait
    for it at the next collective): its checks and its cost a step (:func:`_cost`); else None."""
    r = next((x for x in ranks if x.rank == rank), None)
    if r is None or not r.steps or not any(s.anomaly for s in r.steps) or all(any(s.anomaly for s in x.steps) for x in ranks):
        return None
    return statistics.fmean(s.anomaly.checks if s.anomaly else 0 for s in r.steps), statistics.fmean(_cost(r))


def anomaly_mode(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Any rank's backward runs the engine's NaN checks: a debugging aid left on, told whatever it costs (at most an
    info line below WARNING_FRACTION, as every finding)."""
    hit = [r for r in ranks if any(s.anomaly for s in r.steps)]
    if not hit:
        return None
    worst = max(hit, key=lambda r: statistics.fmean(_cost(r)))
    checks = statistics.fmean(s.anomaly.checks if s.anomaly else 0 for s in worst.steps)
    check_ms = statistics.fmean(s.anomaly.check_ms if s.anomaly else 0.0 for s in worst.steps)
    traced_ms = statistics.fmean(s.anomaly.traceback_ms if s.anomaly else 0.0 for s in worst.steps)
    step = f"{worst.mean_step_ms or 0:.1f} ms {step_word(worst)}"
    times = "once" if round(checks) == 1 else f"{checks:.0f} times"
    tracebacks = (
        f" Forward formats a Python traceback for each op that records a gradient function: {traced_ms:.1f} ms a "
        f"{step_word(worst)} in torch/fx/traceback.py's format_stack, by the Python stack."
        if traced_ms > 0 else
        " Forward also formats a Python traceback for each op that records a gradient function, time inside its ops "
        "that this trace does not separate (the agent's stack samples or with_stack do)."
    )
    without = [r for r in ranks if r not in hit]
    others = f" Only {ranks_text(hit)} run{'s' if len(hit) == 1 else ''} it: the others wait at the next collective." if without else ""
    device = (
        " Each check reads a device value: the autograd thread waits for every kernel queued before it, and the "
        f"device idles while the next node's kernels are launched: {worst.idle.ms('anomaly'):.1f} ms a "
        f"{step_word(worst)} in the checks and after their reads."
        if worst.idle is not None else ""
    )
    return make_finding(
        "anomaly_mode",
        worst,
        statistics.fmean(_cost(worst)),
        title=f"Autograd's anomaly detection is on: backward checks every gradient for NaN, {times} a {step_word(worst)}",
        evidence=(
            f"The autograd engine checks each backward node's outputs for NaN on {ranks_text(hit)} (aten::isnan, "
            f"aten::_is_any_true and a read of the answer, aten::item, inside the node): {checks:.0f} check{'' if round(checks) == 1 else 's'}, "
            f"{check_ms:.1f} ms of the {step} on rank {worst.rank}.{others}{device}{tracebacks}"
        ),
        fix=(
            "Turn anomaly detection off for training: remove torch.autograd.set_detect_anomaly(True) (or the "
            "torch.autograd.detect_anomaly() context around the step). It is a debugging aid: turn it on for a few "
            "steps to find the op that first makes a NaN, then off."
            + in_loop(worst.loop, [Change.NO_ANOMALY_DETECTION])
        ),
        ranks=[r.rank for r in hit],
        # Whether one step holds it, by the checks alone: the samples put a few ms of tracebacks in whichever step
        # a sample fell in (5 ms apart), which would make three steps of steady cost read as one step's.
        one_off=one_step(worst, [s.anomaly.check_ms if s.anomaly else 0.0 for s in worst.steps]),
        # The fix removes the checks, the tracebacks the Python stack saw, and those it missed: a sampler that waits
        # for the GIL sees little of a 0.2 ms traceback between two ops that release it (with_stack frames see all).
        floor=(
            "more: forward's tracebacks run inside its ops, where the trace does not tell them from the ops' own work"
            if not all(s.anomaly.tracebacks_whole for s in worst.steps if s.anomaly) else None
        ),
    )
