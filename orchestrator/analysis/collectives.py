"""Which collectives a rank's main thread spends its communication time in, by name: the evidence the
communication finding chooses its fix from (DDP's all-reduce and FSDP's all-gather / reduce-scatter want
different changes), and what each collective kernel runs when the kernel does not say."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

from orchestrator.analysis.intervals import Intervals, by_time, clip, total, union
from orchestrator.analysis.spans import Kinds, collective_of, is_comm, is_functional
from orchestrator.models.analysis import CollectiveKind, OpStat
from orchestrator.traces.loader import Span

__all__ = ["comm_ops", "launched_by", "optimizer_comm", "own_comm", "regathers_per_step"]

# FSDP2 names its regions after the module they serve: "FSDP::all_gather (layers.3)". One name per kind.
_MODULE_SUFFIX = re.compile(r" \([^()]*\)$")
_GATHER = "FSDP::all_gather"
Window = tuple[float, float]
Thread = tuple[object, object]
Launch = tuple[float, float, Thread]  # a runtime call's start, end and thread


def _outermost(main: Kinds, windows: Sequence[Window]) -> Iterator[Span]:
    """The outermost collective spans of the main thread (its spans by kind) that start inside one of ``windows``."""
    spans = sorted((s for group in main.values() if is_comm(group[0]) for s in group), key=lambda s: (s.ts, -s.end))
    covered_until = float("-inf")
    for span in spans:
        if span.ts < covered_until:
            continue  # inside a collective already counted (c10d::_allgather_base_ in FSDP::all_gather)
        covered_until = span.end
        if _window_of(span.ts, windows) is not None:
            yield span


def comm_ops(main: Kinds, windows: Sequence[Window], optimizer: Intervals) -> list[OpStat]:
    """The outermost collective spans of the main thread that start inside one of ``windows`` and not in the
    optimizer's own time (:func:`optimizer_comm`'s), summed by name with FSDP's module suffix removed; largest time
    first."""
    acc: dict[str, list[float]] = {}
    for span in _outermost(main, windows):
        if clip(optimizer, span.ts, span.end):
            continue
        row = acc.setdefault(_MODULE_SUFFIX.sub("", span.name), [0, 0.0])
        row[0] += 1
        row[1] += span.end - span.ts
    return by_time(acc)


def own_comm(
    main: Kinds, windows: Sequence[Window], model: Intervals, waits: Intervals, launched: Callable[[Intervals], float]
) -> tuple[OpStat, Intervals] | None:
    """The main thread's all-reduce and barrier calls that are the job's own, not DDP's buckets (launched in
    backward): those that overlap no forward or backward (``model``) time, a metric or the loss reduced for logging,
    one round trip across the ranks each (a TorchRec pipeline's input all-to-all, also outside forward, is not one),
    and there the all-gathers a barrier opens (:func:`_synced_gather`: a metric's state);
    and, inside the model's time too, a barrier and the all-reduce right after one: a logged value's sync (Lightning's
    ``self.log(..., sync_dist=True)`` runs both for each value inside training_step, which DDP's forward holds;
    neither DDP nor FSDP calls a barrier). Their names and count over ``windows``, and as ``total_ms`` their cost per
    window: the main thread's waits they begin (:func:`_begun`; ``waits``: its collective calls and its idle time while
    another thread communicates: gloo's), plus ``launched(calls)``, the ms per window of device collective kernels
    launched inside those calls that no compute overlaps (NCCL's); with those waits themselves, inside ``windows``
    (whoever holds them makes the calls). None where no such call is found, or ``model`` is empty: a trace that shows
    no backward cannot tell a gradient all-reduce from the job's own."""
    if not model:
        return None
    ordered = list(_outermost(main, windows))
    calls = [
        s for i, s in enumerate(ordered)
        if _own_kind(s.name) and (not clip(model, s.ts, s.end) or _logged(ordered, i))
        or _synced_gather(ordered, i) and not clip(model, s.ts, s.end)
    ]
    return _cost(calls, main, windows, waits, launched)


def optimizer_comm(
    main: Kinds, windows: Sequence[Window], optimizer: Intervals, waits: Intervals, launched: Callable[[Intervals], float]
) -> OpStat | None:
    """The collectives the optimizer's step makes itself, as :func:`own_comm` weighs them: those that start in its own
    time (``optimizer``: Optimizer.step less a closure's forward and backward, where DDP's buckets are reduced), such as
    ZeroRedundancyOptimizer's broadcast of each rank's updated shard. None where it makes none."""
    made = _cost([s for s in _outermost(main, windows) if clip(optimizer, s.ts, s.end)], main, windows, waits, launched)
    return made[0] if made else None


def _cost(
    calls: Sequence[Span], main: Kinds, windows: Sequence[Window], waits: Intervals, launched: Callable[[Intervals], float]
) -> tuple[OpStat, Intervals] | None:
    """``calls``' names and count, and as ``total_ms`` their cost per window: the waits they begin and the exposed
    device collectives they launch; with those waits, inside ``windows``. None without calls."""
    if not calls:
        return None
    # The waits these calls begin, and no other: not those other collectives begin outside the model (Lightning's
    # per-step broadcast of its SIGTERM flag, a TorchRec pipeline's input all-to-all), nor the wait for DDP's last
    # buckets at backward's end, where the main thread runs no node of backward.
    starts = sorted(s.ts for group in main.values() for s in group)
    held = [iv for t0, t1 in windows for iv in clip(_begun(waits, calls, starts), t0, t1)]
    names = dict.fromkeys(_MODULE_SUFFIX.sub("", s.name) for s in calls)
    host_ms = total(held) / max(len(windows), 1) / 1000
    return OpStat(name=" + ".join(names), calls=len(calls), total_ms=host_ms + launched(union((s.ts, s.end) for s in calls))), held


def _logged(ordered: Sequence[Span], i: int) -> bool:
    """Whether the ``i``-th of the main thread's outermost collectives is a logged value's sync: a barrier, or the
    all-reduce that follows one."""
    return ordered[i].name.endswith("barrier") or (i > 0 and ordered[i - 1].name.endswith("barrier"))


def _synced_gather(ordered: Sequence[Span], i: int) -> bool:
    """Whether the ``i``-th of the main thread's outermost collectives is an all-gather in a run of them that a barrier
    opens: a metric's state gathered from every rank (torchmetrics' ``gather_all_tensors``: a barrier, then the
    state's sizes and the state itself). An engine's or an optimizer's all-gather of parameters follows no barrier."""
    if collective_of(ordered[i].name) != "all_gather":
        return False
    while i >= 0 and collective_of(ordered[i].name) == "all_gather":
        i -= 1
    return i >= 0 and ordered[i].name.endswith("barrier")


def _begun(waits: Intervals, calls: Sequence[Span], starts: Sequence[float]) -> Intervals:
    """The parts of ``waits`` that ``calls`` begin: from each call's start to the next span the main thread opens after
    it ends (``starts``: sorted), where it waits for that call (gloo's thread picks a collective up a moment after
    the call returns)."""
    out: Intervals = []
    for call in calls:
        i = bisect.bisect_right(starts, call.end)
        out += clip(waits, call.ts, starts[i] if i < len(starts) else float("inf"))
    return union(out)


def _own_kind(name: str) -> bool:
    """An all-reduce or a barrier (``c10d::barrier``: an all-reduce of one element that moves no data), as a loop calls
    them: not a functional collective, which DTensor (tensor parallelism) and compiled graphs issue."""
    return not is_functional(name) and (collective_of(name) == "all_reduce" or name.endswith("barrier"))


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
