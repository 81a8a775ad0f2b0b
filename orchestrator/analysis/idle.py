"""Device-idle attribution: every idle gap of a rank's device, blamed on what the host did during it.

The device's timeline (kernels, copies, memsets) is cut into busy spans and
idle gaps inside the analysed windows. A gap ends when the device starts its
next piece of work, which some host thread launched (the runtime call with the
same correlation id). That launch says who the device waited for:

* launched (the call had returned) before the gap began: the work was queued and
  the device waited on itself (a stream or event dependency): ``queued``, named by the launching call
  (``cudaGraphLaunch``: the gap is before or between a replayed graph's nodes);
* launched during the gap: until the launch call began the device waited for
  the *launching thread*, so that stretch is cut by what that thread was
  doing, by the first rule that holds: recording a CUDA/HIP graph (``capture``: from
  ``cudaStreamBeginCapture`` to ``...EndCapture``, the graph's instantiation, torch.cuda.graph's
  set-up; the launches in it run nothing until the graph is replayed), compiling (``compile``: torch.compile's
  ``dynamo_timed`` regions), in a DataLoader ``next()`` (``data``), in one of autograd's anomaly-detection NaN
  checks (``anomaly``: from its ``aten::isnan`` to the ``aten::item`` that reads the answer, on any thread), in
  a sync or device-to-host read (``sync``), blocked in a host-to-device copy
  (``copy``), in a collective (``collective``), in a device runtime call (CUDA, HIP, MTIA)
  (``runtime``: the allocator, events, streams, a slow launch; named by the call),
  in any other profiled span (``cpu``; named by the innermost span, and by the
  optimizer step or ``record_function`` region around it), in a ``ProfilerStep``
  but in no op (``cpu``, "Python outside any op"; named by its innermost Python frame of the user's code
  in a ``with_stack`` trace, or from the agent's stack samples: :mod:`~orchestrator.analysis.python_frames`),
  else ``untraced``. From the launch
  call on, the gap is the launch's (``launch``; up to :data:`LAUNCH_GAP_US` after the call returns, then
  ``queued``: a kernel the device starts later waited on a dependency) unless the call itself is slower than
  :data:`LAUNCH_GAP_US` (the runtime loads modules or allocates: host time, named by
  the call); a ``cpu`` stretch of a gap shorter than :data:`LAUNCH_GAP_US`: the host
  dispatches kernels no faster than the device runs them;
* the next work's launch is unknown (not recorded, or after the window): the
  main thread's activity, as above.

*Drain after a sync*: a sync or device-to-host read (on any thread) empties the
device's queue, and the host has to launch anew after it returns, so the gaps
that follow (the launching thread behind the device) are the sync's (``sync``),
up to what the waits cost: the device work (not a collective's spinning kernel)
that ran while the host waited, which it would otherwise have run ahead of. The
waits' work adds up, and each such gap spends it, in time order. This is
TraceLens's ``sync_drain`` with a bound: a host-bound job, whose host is behind
the device anyway, waits out little work and is not blamed on its syncs. What
would be ``runtime``, ``cpu``, ``launch`` or ``untraced`` there is the sync's;
the DataLoader, copies and collectives keep their own causes. A drain after an anomaly check's read is the
check's (``anomaly``): turning anomaly detection off removes it, and no sync of the job's made it (an H200 CNN under
``detect_anomaly()`` had 1.1 ms of such drains a step, told as its one ``cudaDeviceSynchronize``'s).

``late_rank`` is given out across ranks (:func:`orchestrator.analysis.cross.blame_late_ranks`): on a rank
that waits for late arrivers, its collective and sync idle time, up to what it
waits for them. This is HTA's idle-time breakdown (host wait, kernel wait,
other) taken further: the host wait is split by its cause.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.analysis.idle_summary import summarize
from orchestrator.analysis.intervals import (
    Intervals,
    by_time,
    clip,
    cover,
    intersect,
    name_innermost,
    subtract,
    total,
    union,
)
from orchestrator.analysis.python_frames import callers
from orchestrator.analysis.spans import (
    Kinds,
    compilations,
    graph_captures,
    is_comm,
    is_comm_kernel,
    is_data,
    is_marker_name,
    is_runtime,
    is_sync,
    regions_within,
    where,
)
from orchestrator.models.analysis import IDLE_CAUSES, IdleAttribution, IdleCause, OpStat
from orchestrator.traces.loader import Span

__all__ = ["LAUNCH_GAP_US", "PYTHON_OUTSIDE_OPS", "HostThread", "attribute"]

# A gap between two kernels shorter than this, while the host runs ops, is the host's launch pace, not one slow op.
LAUNCH_GAP_US = 50.0
# How many host ops the cpu cause names.
TOP_CPU_OPS = 5
PYTHON_OUTSIDE_OPS = "Python outside any op"
# Ops that allocate, alias or reshape a tensor: no call launches device work, and none computes on the host either.
_COMPUTE_NOTHING = (
    "aten::empty", "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::reshape", "aten::_reshape_alias",
    "aten::resize_", "aten::set_", "aten::detach", "aten::alias", "aten::lift", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::slice", "aten::select", "aten::squeeze", "aten::unsqueeze", "aten::split",
    "aten::chunk", "aten::narrow", "aten::unbind", "aten::flatten", "aten::unflatten", "aten::record_stream",
    "aten::_has_compatible_shallow_copy_type",
)

Thread = tuple[object, object]
Window = tuple[float, float]


@dataclass
class HostThread:
    """What one host thread was doing, as interval lists, in the order the rules ask them."""

    data: Intervals = field(default_factory=list)
    sync: Intervals = field(default_factory=list)
    copy: Intervals = field(default_factory=list)
    collective: Intervals = field(default_factory=list)
    runtime: Intervals = field(default_factory=list)  # the device runtime's and driver's calls (CUDA, HIP, MTIA)
    busy: Intervals = field(default_factory=list)  # any span but the step spans
    # On the main thread: collectives on its process's other threads (gloo's worker), while it is in no span.
    elsewhere: Intervals = field(default_factory=list)
    steps: Intervals = field(default_factory=list)  # ProfilerStep spans: Python runs there even outside ops
    spans: Sequence[Span] = ()  # sorted by (start, -end), to name the innermost span
    skip: frozenset[str] = frozenset()  # span names never named (the step spans)
    regions: Sequence[Span] = ()  # optimizer steps and record_function regions, sorted, to name the innermost
    capture: Intervals = field(default_factory=list)  # recording CUDA/HIP graphs (spans.graph_captures)
    compile: Intervals = field(default_factory=list)  # torch.compile compiling (spans.compilations)
    # The optimizer's own time: its steps less the forward and backward a closure runs inside them (None: all of it).
    optimizer: Intervals | None = None
    # Python frames of the user's code (a with_stack trace's, or the stack samples' where it runs no op), sorted as ``spans``
    frames: Sequence[Span] = ()

    @classmethod
    def other(cls, spans: list[Span], kinds: Kinds, windows: Sequence[Window]) -> HostThread:
        """What a thread other than the main one was doing, for the device idle gaps its launches end."""
        regions, around = regions_within(kinds, windows)
        return cls(
            data=union(where(kinds, is_data)), sync=union(where(kinds, is_sync)), collective=union(where(kinds, is_comm)),
            runtime=union(where(kinds, is_runtime)), busy=cover(spans), spans=spans, skip=around, regions=regions,
            capture=graph_captures(kinds), compile=compilations(kinds),
        )


@dataclass
class _Drain:
    """The latest sync seen, and what is left of the device work the waits so far sat out, to give to the gaps after them."""

    sync: tuple[float, float] | None = None
    left: float = 0.0

    def take(self, syncs: Intervals, work: Intervals, a: float, b: float) -> tuple[float, float] | None:
        """The part of the gap ``(a, b)`` that the syncs before ``a`` drained, if any (``syncs``: every thread's, merged)."""
        i = bisect.bisect_right(syncs, a, key=lambda iv: iv[0]) - 1
        if i < 0:
            return None
        if syncs[i] != self.sync:
            self.sync = syncs[i]
            self.left += total(clip(work, *syncs[i]))  # the queued work the host waited out
        start = max(a, syncs[i][1])  # in the wait itself the gap is the sync's already
        length = min(b - start, self.left)
        if length <= 0:
            return None
        self.left -= length
        return (start, start + length)


def _busy_and_first(spans: Sequence[Span]) -> tuple[Intervals, list[Span]]:
    """The device's busy intervals (spans in start order) and the span that opens each."""
    busy: Intervals = []
    first: list[Span] = []
    end = float("-inf")
    for s in spans:
        if s.end <= s.ts:
            continue
        if s.ts > end:
            busy.append((s.ts, s.end))
            first.append(s)
            end = s.end
        elif s.end > end:
            end = s.end
            busy[-1] = (busy[-1][0], end)
    return busy, first


def attribute(
    device_spans: Sequence[Span],
    windows: Sequence[Window],
    launches: dict[int, tuple[float, float, Thread]],
    host_of: Callable[[Thread], HostThread],
    main: Thread | None,
    launchers: Mapping[int, str] | None = None,
    checks: Intervals | None = None,
) -> tuple[IdleAttribution, list[dict[IdleCause, float]]]:
    """The idle attribution over ``windows`` (sorted, disjoint), and each window's idle ms by cause.

    ``launches``: correlation id -> (start, end, thread) of the runtime call that launched it; ``launchers``: its
    name (``cudaGraphLaunch``), which names the queued work that waits (a graph replay's nodes share its id);
    ``checks``: anomaly detection's NaN checks (merged, any thread's).
    """
    busy, first = _busy_and_first(device_spans)
    starts = [iv[0] for iv in busy]
    out: dict[IdleCause, Intervals] = defaultdict(list)
    pieces: dict[Thread | None, Intervals] = defaultdict(list)
    launched: dict[Thread | None, Intervals] = defaultdict(list)  # each thread's launch pieces, to name their regions
    hosts: dict[Thread | None, HostThread] = {}

    def host(thread: Thread | None) -> HostThread:
        if thread not in hosts:
            hosts[thread] = host_of(thread) if thread is not None else HostThread()
        return hosts[thread]

    short: Intervals = []
    drains: Intervals = []
    checked: Intervals = []  # drains after an anomaly check's read
    checks = checks or []
    # A sync on any thread drains the device's one queue, for every thread's launches after it.
    syncs = union(iv for thread in {main, *(t for _, _, t in launches.values())} for iv in host(thread).sync)
    # A collective kernel that runs during a wait spins for the other ranks: the late-rank story, not queued work.
    work = union((s.ts, s.end) for s in device_spans if not is_comm_kernel(s))
    drain = _Drain()

    def drained(a: float, b: float) -> None:
        if (piece := drain.take(syncs, work, a, b)) is not None:
            from_check = drain.sync is not None and clip(checks, *drain.sync)
            (checked if from_check else drains).append(piece)

    queued_by: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # the launching call of the work that waited
    k, n = 0, len(starts)
    for a, b in subtract(union(windows), busy):
        while k < n and starts[k] < b:  # both in time order: the next busy span starts at or after the gap's end
            k += 1
        nxt = first[k] if k < n else None
        launch = launches.get(nxt.correlation) if nxt is not None and nxt.correlation is not None else None
        if launch is None:
            pieces[main].append((a, b))
            drained(a, b)
            continue
        called, returned, thread = launch
        waiting = (launchers or {}).get(nxt.correlation, "") if nxt is not None and nxt.correlation is not None else ""
        if returned <= a:
            _queue(out, queued_by, waiting, a, b)
            continue
        drained(a, b)
        cut = min(max(called, a), b)
        if returned - called > LAUNCH_GAP_US:
            cut = min(returned, b)  # a slow launch call does the runtime's own work (module loading): host time, named by the call
        if cut > a:
            pieces[thread].append((a, cut))
            if starts[k] - a < LAUNCH_GAP_US:
                short.append((a, cut))
        # The device starts a launched kernel within LAUNCH_GAP_US of its call's return; what it waits beyond that
        # is a dependency (an event, another stream's work), as when the launch came before the gap.
        ready = min(b, max(cut, returned + LAUNCH_GAP_US))
        if cut < ready:
            launched[thread].append((cut, ready))
        if ready < b:
            _queue(out, queued_by, waiting, ready, b)
    drains, checked = union(drains), union(checked)
    named: dict[IdleCause, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    regions: dict[IdleCause, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    model_named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    python_named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for who in set(pieces) | set(launched):
        rest = union(pieces.get(who, []))
        h = host(who)
        for cause, intervals in (
            ("capture", h.capture), ("compile", h.compile), ("data", h.data), ("anomaly", checks), ("sync", h.sync),
            ("copy", h.copy), ("collective", h.collective),
        ):
            taken = intersect(rest, intervals)
            out[cause] += taken  # type: ignore[index]
            rest = subtract(rest, taken)
        for cause, after in (("anomaly", checked), ("sync", drains)):
            taken = intersect(rest, after)
            out[cause] += taken  # type: ignore[index]
            rest = subtract(rest, taken)
        cpu = intersect(rest, h.busy)
        rest = subtract(rest, cpu)
        waiting = intersect(rest, h.elsewhere)
        out["collective"] += waiting
        rest = subtract(rest, waiting)
        python = intersect(rest, h.steps)
        out["untraced"] += subtract(rest, python)
        paced = intersect(cpu, union(short))
        cpu = subtract(cpu, paced)
        launch_pace = union(launched.get(who, []))
        out["anomaly"] += intersect(launch_pace, checked)
        out["sync"] += intersect(launch_pace, drains)
        launch_pace = union(subtract(launch_pace, union(drains + checked)) + paced)
        out["launch"] += launch_pace
        runtime = intersect(cpu, h.runtime)
        cpu = subtract(cpu, runtime)
        out["runtime"] += runtime
        out["cpu"] += cpu + python
        name_innermost(h.spans, runtime, h.skip, named["runtime"], PYTHON_OUTSIDE_OPS)
        name_innermost(h.spans, cpu, h.skip, named["cpu"], PYTHON_OUTSIDE_OPS)
        if python:
            entry = named["cpu"][PYTHON_OUTSIDE_OPS]
            entry[0] += len(python)
            entry[1] += total(python)
        steps = [s for s in h.regions if s.name.startswith("Optimizer.")]
        own = h.optimizer if h.optimizer is not None else cover(steps)
        users = [s for s in h.regions if not s.name.startswith("Optimizer.")]
        # The model's own ops: cpu time outside the optimizer's own time and the user's regions (a closure's forward
        # and backward inside Optimizer.step are the model's), so no op is counted with a region it runs in.
        outside = union(own + cover(users))
        name_innermost(h.spans, subtract(cpu, outside), h.skip, model_named, PYTHON_OUTSIDE_OPS)
        name_innermost(h.frames, subtract(python, outside), frozenset(), python_named, PYTHON_OUTSIDE_OPS)
        for cause, ivs in (("cpu", union(cpu + python)), ("runtime", runtime), ("launch", launch_pace)):
            name_innermost(steps, intersect(ivs, own), frozenset(), regions[cause], PYTHON_OUTSIDE_OPS)  # type: ignore[index]
            name_innermost(users, ivs, frozenset(), regions[cause], PYTHON_OUTSIDE_OPS)  # type: ignore[index]
    merged = {cause: union(intervals) for cause, intervals in out.items()}
    per_window = [
        {c: ms for c in IDLE_CAUSES if c in merged and (ms := total(clip(merged[c], t0, t1)) / 1000) > 0} for t0, t1 in windows
    ]
    step_ms = sum(t1 - t0 for t0, t1 in windows) / max(len(windows), 1) / 1000
    for by_region in regions.values():
        by_region.pop(PYTHON_OUTSIDE_OPS, None)  # time in no region
    names: dict[IdleCause, dict[str, object]] = defaultdict(dict)
    named["queued"] = queued_by
    for cause, by_name in named.items():
        names[cause]["top"] = _top(by_name)
    for cause, by_name in regions.items():
        names[cause]["regions"] = _top(by_name)
    ops = {name: entry for name, entry in model_named.items() if name != PYTHON_OUTSIDE_OPS and not is_marker_name(name)}
    python_named.pop(PYTHON_OUTSIDE_OPS, None)  # in no frame of the user's code
    top_ops = _top(ops)
    names["cpu"].update(
        model_ops=top_ops, model_ops_ms=sum(us for _, us in ops.values()) / 1000,
        host_only_ops=(host_only := _host_only({o.name for o in top_ops}, hosts, launches)),
        host_op_callers=_callers_of(next((o.name for o in top_ops if o.name in host_only), None), host(main), windows),
        python_frames=_top(python_named), python_frames_ms=sum(us for _, us in python_named.values()) / 1000,
    )
    return summarize(per_window, names, step_ms), per_window


def _queue(out: dict[IdleCause, Intervals], by: dict[str, list[float]], launcher: str, a: float, b: float) -> None:
    """Idle from ``a`` to ``b`` while launched work waits, named by its launching call (if the trace has its name)."""
    out["queued"].append((a, b))
    if launcher:
        by[launcher][0] += 1
        by[launcher][1] += b - a


def _host_only(
    names: set[str], hosts: Mapping[Thread | None, HostThread], launches: Mapping[int, tuple[float, float, Thread]]
) -> list[str]:
    """Of the ATen ops ``names``, those called on a thread that launches device work and never holding a launch:
    they compute on CPU tensors (TraceLens' MI300 OWLv2 pipeline: torch.max over its detections' scores, 8.8 ms a
    call). Allocation and view ops launch nothing and compute nothing: they are not named; nor is an op seen only on
    threads whose launches the trace does not tie to their work (an MTIA's)."""
    names = {n for n in names if n.startswith("aten::") and not n.startswith(_COMPUTE_NOTHING)}
    seen: set[str] = set()
    launching: set[str] = set()
    for thread, h in hosts.items():
        starts = sorted(t0 for t0, _, who in launches.values() if who == thread)
        if not starts:
            continue
        for span in h.spans:
            if span.name in names and span.name not in launching:
                seen.add(span.name)
                i = bisect.bisect_left(starts, span.ts)
                if i < len(starts) and starts[i] < span.end:
                    launching.add(span.name)
    return sorted(seen - launching)


def _callers_of(op: str | None, h: HostThread, windows: Sequence[Window]) -> list[OpStat]:
    """The innermost frames of the user's or a library's code around ``op``'s calls on ``h`` in ``windows``."""
    if op is None or not h.frames:
        return []
    calls = union(iv for s in h.spans if s.name == op for t0, t1 in windows for iv in clip([(s.ts, s.end)], t0, t1))
    return callers(h.frames, calls)[:TOP_CPU_OPS]


def _top(named: dict[str, list[float]]) -> list[OpStat]:
    return [s for s in by_time(named)[:TOP_CPU_OPS] if s.total_ms > 0]
