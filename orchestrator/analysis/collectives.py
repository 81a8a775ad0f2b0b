"""Which collectives a rank's main thread spends its communication time in, by name: the evidence the
communication finding chooses its fix from (DDP's all-reduce and FSDP's all-gather / reduce-scatter want
different changes), and what each collective kernel runs when the kernel does not say."""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence

from orchestrator.analysis.intervals import Intervals, clip, subtract, total
from orchestrator.analysis.spans import Kinds, collective_of, is_comm
from orchestrator.models.analysis import CollectiveKind, OpStat
from orchestrator.traces.loader import Span

__all__ = ["comm_ops", "launched_by", "own_comm", "regathers_per_step"]

# FSDP2 names its regions after the module they serve: "FSDP::all_gather (layers.3)". One name per kind.
_MODULE_SUFFIX = re.compile(r" \([^()]*\)$")
_GATHER = "FSDP::all_gather"
Window = tuple[float, float]
Thread = tuple[object, object]
Launch = tuple[float, float, Thread]  # a runtime call's start, end and thread


def comm_ops(main: Kinds, windows: Sequence[Window], leave_out: Intervals | None = None) -> list[OpStat]:
    """The outermost collective spans of the main thread (its spans by kind) that start inside one of ``windows``,
    summed by name with FSDP's module suffix removed; largest time first. Spans that overlap ``leave_out`` do not count."""
    spans = sorted((s for group in main.values() if is_comm(group[0]) for s in group), key=lambda s: (s.ts, -s.end))
    acc: dict[str, list[float]] = {}
    covered_until = float("-inf")
    for span in spans:
        if span.ts < covered_until:
            continue  # inside a collective already counted (c10d::_allgather_base_ in FSDP::all_gather)
        covered_until = span.end
        if _window_of(span.ts, windows) is not None and not (leave_out and clip(leave_out, span.ts, span.end)):
            row = acc.setdefault(_MODULE_SUFFIX.sub("", span.name), [0, 0.0])
            row[0] += 1
            row[1] += span.end - span.ts
    return [
        OpStat(name=name, calls=int(c), total_ms=us / 1000)
        for name, (c, us) in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def own_comm(main: Kinds, windows: Sequence[Window], waits: Intervals, model: Intervals) -> OpStat | None:
    """The main thread's collective calls that overlap no forward or backward (``model``) time: not DDP's bucket
    all-reduces or FSDP's gathers, but the job's own (a metric or the loss reduced for logging, a barrier); their
    names, their count over ``windows``, and as ``total_ms`` the communication time (``waits``: the main thread's
    collective calls and its idle time while another thread communicates) outside ``model``, per window."""
    calls = comm_ops(main, windows, leave_out=model)
    if not calls:
        return None
    outside = subtract(waits, model)
    ms = sum(total(clip(outside, t0, t1)) for t0, t1 in windows) / max(len(windows), 1) / 1000
    return OpStat(name=" + ".join(c.name for c in calls), calls=sum(c.calls for c in calls), total_ms=ms)


def launched_by(kernels: Sequence[Span], launches: Mapping[int, Launch], kinds: Mapping[Thread, Kinds]) -> dict[int, CollectiveKind]:
    """Correlation id -> the collective of the innermost host collective (``c10d::allreduce_``, ``nccl:all_to_all``,
    ``FSDP::all_gather``) around the runtime call that launched each of ``kernels``, on whichever thread made it
    (DDP all-reduces from the autograd thread). ``launches``: correlation id -> (start, end, thread) of the call.

    The host's call says what a kernel runs where the kernel cannot: a trace before PyTorch 2.2 writes no collective
    name on it, and NCCL's generic kernel carries a send/recv name whatever it runs."""
    named: dict[Thread, tuple[list[float], list[tuple[float, CollectiveKind]], float]] = {}
    out: dict[int, CollectiveKind] = {}
    for kernel in kernels:
        if kernel.correlation is None or (launch := launches.get(kernel.correlation)) is None:
            continue
        at, _, thread = launch
        if thread not in named:
            spans = sorted(
                (s for group in kinds.get(thread, {}).values() if is_comm(group[0]) for s in group), key=lambda s: s.ts
            )
            rows = [(s.end, collective_of(s.name)) for s in spans]
            named[thread] = ([s.ts for s in spans], rows, max((s.end - s.ts for s in spans), default=0.0))
        starts, rows, longest = named[thread]
        # The latest-starting span around the call is the innermost; none starting before at - longest can hold it.
        i = bisect.bisect_right(starts, at) - 1
        while i >= 0 and starts[i] >= at - longest:
            end, kind = rows[i]
            if at <= end and kind != "other":
                out[kernel.correlation] = kind
                break
            i -= 1
    return out


def regathers_per_step(main: Kinds, windows: Sequence[Window]) -> float:
    """FSDP2: all-gathers per step of a unit already gathered in that step (``FSDP::all_gather (fqn)`` again: its
    parameters were resharded after forward and are gathered anew for backward), the mean over ``windows``."""
    again = 0
    for (name, _), group in main.items():
        if name == _GATHER or name.startswith(_GATHER + " ("):
            per_window: dict[int, int] = {}
            for span in group:
                if (i := _window_of(span.ts, windows)) is not None:
                    per_window[i] = per_window.get(i, 0) + 1
            again += sum(c - 1 for c in per_window.values())
    return again / max(len(windows), 1)


def _window_of(ts: float, windows: Sequence[Window]) -> int | None:
    return next((i for i, (t0, t1) in enumerate(windows) if t0 <= ts < t1), None)
