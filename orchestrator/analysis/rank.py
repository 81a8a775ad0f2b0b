"""Per-rank analysis: what one rank did in each profiled step, from its trace alone.

How a step's time is split into phases
--------------------------------------
A step is the ``ProfilerStep#N`` span on the *main thread* (the thread that
carries those spans). Every instant of it is given to exactly one phase, by
the first rule below that holds at that instant, so nested spans are never
counted twice and the phases add up to the step time:

 1. ``data``      inside a DataLoader ``__next__`` span (``enumerate(DataLoader)#...``
                  or ``_next_data``): whatever the loader does, the fix is the loader's.
 2. ``sync``      inside ``aten::item`` / ``aten::_local_scalar_dense`` /
                  ``cuda{Stream,Device,Event}Synchronize``: the host waits for the device.
 3. ``comm``      inside a collective (``c10d::*``, ``nccl:*``, ``gloo:*``, ``record_param_comms``).
 4. ``memcpy``    inside a host-device copy: a ``cudaMemcpy*`` runtime call, widened to
                  the outermost ``aten::to`` / ``aten::_to_copy`` / ``aten::copy_`` around it.
 5. ``optimizer`` inside ``Optimizer.step#...`` / ``Optimizer.zero_grad#...``.
 6. ``backward``  inside ``autograd::engine::evaluate_function`` on the main thread.
 7. ``forward``   inside a module forward span (``*.forward`` annotations such as
                  ``DistributedDataParallel.forward``, or ``nn.Module:`` with with_modules).
 8. The main thread is in no span of rules 1-7 (an untraced gap, or an op of no
    phase). Then the other threads of the process say what it waits for:
    ``backward`` while autograd runs on another thread (GPU backward),
    else ``comm`` while a collective runs on another thread (gloo's worker
    thread: this is the allreduce wait of synchronous data parallelism).
 9. ``forward``   before the step's first backward span: the model and loss,
                  which need not carry any marker.
10. ``other``     the rest: logging, metrics, Python between optimizer and next step.

Rules 2-4 come before 5-7 because a sync, collective or copy is what costs time
wherever it is called from (``loss.item()`` inside the forward is a sync).

A rank's *communication wait* per step is its ``comm`` phase plus, on GPU, the
collective kernel time not overlapped by compute kernels; in a synchronous
allreduce the fast ranks wait for the slowest, so it is largest on fast ranks.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from orchestrator.analysis.intervals import Intervals, clip, intersect, subtract, total, union
from orchestrator.analysis.models import (
    PHASES,
    GpuStats,
    MemoryPeak,
    OpStat,
    Phase,
    PhaseTimes,
    RankSummary,
    StepBreakdown,
)
from orchestrator.layout import parse_profiler_step
from orchestrator.traces.loader import RankTrace, Span

__all__ = ["TOP_N", "analyze_rank", "is_comm", "is_sync"]

TOP_N = 10

_SYNC_NAMES = frozenset(
    {
        "aten::item",
        "aten::_local_scalar_dense",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
    }
)
_COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "ucc:", "mpi:")
_COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
_GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})


def is_sync(span: Span) -> bool:
    """A call that blocks the host until the device catches up."""
    return span.name in _SYNC_NAMES


def is_comm(span: Span) -> bool:
    """A host-side collective call or its worker span."""
    return span.name.startswith(_COMM_PREFIXES) or span.name == "record_param_comms"


def _is_memcpy_call(span: Span) -> bool:
    return span.cat in ("cuda_runtime", "cuda_driver") and "Memcpy" in span.name


def _is_data(span: Span) -> bool:
    return span.name.startswith("enumerate(DataLoader)#") or (span.cat == "python_function" and "_next_data" in span.name)


def _is_optimizer(span: Span) -> bool:
    return span.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def _is_backward(span: Span) -> bool:
    return span.name.startswith("autograd::engine::evaluate_function")


def _is_forward(span: Span) -> bool:
    return (span.cat == "user_annotation" and span.name.endswith(".forward")) or span.name.startswith("nn.Module:")


def _is_comm_kernel(span: Span) -> bool:
    return span.cat == "kernel" and "nccl" in span.name.lower()


def _walk_thread(spans: list[Span], on_span: Callable[[Span, list[Span]], None]) -> dict[int, float]:
    """Call ``on_span(span, open_ancestors)`` in nesting order; return each span's self time.

    ``spans`` is one thread's, sorted by (start, -end). Self time is keyed by
    ``id(span)``; children that spill past their parent by rounding still count as children.
    """
    stack: list[Span] = []
    self_us: dict[int, float] = {}
    for span in spans:
        while stack and stack[-1].end <= span.ts:
            stack.pop()
        on_span(span, stack)
        self_us[id(span)] = span.end - span.ts
        if stack:
            parent = stack[-1]
            self_us[id(parent)] -= min(span.end, parent.end) - span.ts
        stack.append(span)
    return self_us


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def analyze_rank(trace: RankTrace, *, top_n: int = TOP_N) -> RankSummary:
    """Steps, phase split, GPU use, top ops/kernels and memory peaks of one rank."""
    host_threads: dict[tuple[object, object], list[Span]] = defaultdict(list)
    gpu: list[Span] = []
    for span in trace.spans:
        if span.cat in _GPU_CATEGORIES:
            gpu.append(span)
        elif span.cat in _HOST_CATEGORIES:
            host_threads[(span.pid, span.tid)].append(span)

    step_counts = Counter(key for key, spans in host_threads.items() for s in spans if parse_profiler_step(s.name) is not None)
    issues: list[str] = []
    if not step_counts:
        issues.append("no ProfilerStep#N spans: the profiler ran without a schedule, so steps cannot be found")
    main_key = step_counts.most_common(1)[0][0] if step_counts else None
    main = host_threads.get(main_key, [])
    # Other threads of the main thread's process: autograd and collective workers.
    others = [s for key, spans in host_threads.items() if main_key and key != main_key and key[0] == main_key[0] for s in spans]

    # Host-side walk over every thread: operator self times, and on the main
    # thread the copy intervals and the outermost sync call names.
    op_self: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    copy_spans: list[tuple[float, float]] = []
    sync_calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for key, spans in host_threads.items():
        is_main = key == main_key

        def on_span(span: Span, ancestors: list[Span], is_main: bool = is_main) -> None:
            if not is_main:
                return
            if _is_memcpy_call(span):
                outer = next((a for a in ancestors if a.name in _COPY_OPS), span)
                copy_spans.append((outer.ts, outer.end))
            if is_sync(span) and not any(is_sync(a) for a in ancestors):
                sync_calls[span.name][0] += 1
                sync_calls[span.name][1] += span.end - span.ts

        self_us = _walk_thread(spans, on_span)
        for span in spans:
            if span.cat == "cpu_op":
                entry = op_self[span.name]
                entry[0] += 1
                entry[1] += self_us[id(span)]

    def main_union(pred: Callable[[Span], bool]) -> Intervals:
        return union((s.ts, s.end) for s in main if pred(s))

    rules: list[tuple[Phase, Intervals]] = [
        ("data", main_union(_is_data)),
        ("sync", main_union(is_sync)),
        ("comm", main_union(is_comm)),
        ("memcpy", union(copy_spans)),
        ("optimizer", main_union(_is_optimizer)),
        ("backward", main_union(_is_backward)),
        ("forward", main_union(_is_forward)),
    ]
    any_main_span = union((s.ts, s.end) for s in main if not parse_profiler_step(s.name) is not None)
    backward_elsewhere = union((s.ts, s.end) for s in others if _is_backward(s))
    comm_elsewhere = union((s.ts, s.end) for s in others if is_comm(s))
    backward_anywhere = union(rules[5][1] + backward_elsewhere)

    gpu_busy = union((s.ts, s.end) for s in gpu)
    comm_kernels = union((s.ts, s.end) for s in gpu if _is_comm_kernel(s))
    compute_kernels = union((s.ts, s.end) for s in gpu if s.cat == "kernel" and not _is_comm_kernel(s))
    kernels = [s for s in gpu if s.cat == "kernel"]
    step_spans = sorted((s for s in main if parse_profiler_step(s.name) is not None), key=lambda s: s.ts)
    per_step_gpu = _gpu_work_per_step(gpu, step_spans)

    base_us = trace.file.base_time_ns / 1000
    steps: list[StepBreakdown] = []
    gpu_rows: list[tuple[float, float, float, float, int, int, int]] = []
    for index, step_span in enumerate(step_spans):
        t0, t1 = step_span.ts, step_span.end
        remaining: Intervals = [(t0, t1)] if t1 > t0 else []
        phase_us: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        for phase, intervals in rules:
            taken = intersect(clip(intervals, t0, t1), remaining)
            phase_us[phase] += total(taken)
            remaining = subtract(remaining, taken)
        # Rule 8: the main thread is idle in no span of its own.
        idle = subtract(remaining, clip(any_main_span, t0, t1))
        for phase, intervals in (("backward", backward_elsewhere), ("comm", comm_elsewhere)):
            taken = intersect(clip(intervals, t0, t1), idle)
            phase_us[phase] += total(taken)
            remaining = subtract(remaining, taken)
            idle = subtract(idle, taken)
        first_backward = next(iter(clip(backward_anywhere, t0, t1)), (t1, t1))[0]
        before = clip(remaining, t0, first_backward)
        phase_us["forward"] += total(before)
        phase_us["other"] += total(remaining) - total(before)

        row = None
        if gpu:
            busy = total(clip(gpu_busy, t0, t1))
            comm_in = clip(comm_kernels, t0, t1)
            exposed = total(subtract(comm_in, clip(compute_kernels, t0, t1)))
            row = (busy, per_step_gpu[index][0], total(comm_in), exposed, *per_step_gpu[index][1:])
            gpu_rows.append(row)
        steps.append(
            StepBreakdown(
                step=parse_profiler_step(step_span.name),
                start_unix_us=base_us + t0,
                duration_ms=(t1 - t0) / 1000,
                phases=PhaseTimes(**{p: v / 1000 for p, v in phase_us.items()}),
                sync_calls=len(clip(rules[1][1], t0, t1)),
                copy_calls=len(clip(rules[3][1], t0, t1)),
                gpu_busy_ms=row[0] / 1000 if row else None,
                kernel_ms=row[1] / 1000 if row else None,
                comm_kernel_ms=row[2] / 1000 if row else None,
                comm_exposed_ms=row[3] / 1000 if row else None,
            )
        )

    durations = [s.duration_ms for s in steps]
    mean_phases = PhaseTimes(**{p: _mean(s.phases.get(p) for s in steps) for p in PHASES})
    gpu_stats = _gpu_stats(gpu_rows, durations, comm_kernels, compute_kernels) if gpu else None
    comm_wait = mean_phases.comm + (gpu_stats.comm_exposed_ms_per_step if gpu_stats else 0.0)
    loader = next((s.name.split("#", 1)[1].split(".")[0] for s in main if s.name.startswith("enumerate(DataLoader)#")), None)
    return RankSummary(
        rank=trace.file.rank,
        host=trace.file.host,
        file=trace.file.path.name,
        device="cuda" if gpu else "cpu",
        steps=steps,
        mean_step_ms=_mean(durations) if steps else None,
        median_step_ms=statistics.median(durations) if steps else None,
        mean_phases=mean_phases,
        comm_wait_ms=comm_wait,
        data_loader=loader,
        sync_ops=_top((name, int(c), us) for name, (c, us) in sync_calls.items()),
        gpu=gpu_stats,
        top_ops=_top((name, int(c), us) for name, (c, us) in op_self.items())[:top_n],
        top_kernels=_top(_sum_by_name(kernels))[:top_n],
        memory=_memory(trace),
        issues=issues,
    )


def _gpu_stats(rows: list[tuple[float, ...]], durations: list[float], comm: Intervals, compute: Intervals) -> GpuStats:
    n = max(len(rows), 1)
    comm_total = total(comm)
    return GpuStats(
        utilization=sum(r[0] for r in rows) / 1000 / sum(durations) if sum(durations) else 0.0,
        kernel_ms_per_step=sum(r[1] for r in rows) / 1000 / n,
        comm_kernel_ms_per_step=sum(r[2] for r in rows) / 1000 / n,
        comm_exposed_ms_per_step=sum(r[3] for r in rows) / 1000 / n,
        comm_overlap=total(intersect(comm, compute)) / comm_total if comm_total else None,
        htod_copies_per_step=sum(r[4] for r in rows) / n,
        pageable_htod_copies_per_step=sum(r[5] for r in rows) / n,
        dtoh_copies_per_step=sum(r[6] for r in rows) / n,
    )


def _gpu_work_per_step(gpu: list[Span], steps: list[Span]) -> list[list[float]]:
    """Per step: kernel µs, HtoD copies, pageable HtoD copies, DtoH copies.

    Device work is charged to the step in which it *starts* (one bisection per
    event, not a scan per step), since kernels queued late in a step run into the next.
    """
    starts = [s.ts for s in steps]
    rows = [[0.0, 0, 0, 0] for _ in steps]
    for span in gpu:
        i = bisect.bisect_right(starts, span.ts) - 1
        if i < 0 or span.ts >= steps[i].end:
            continue
        row = rows[i]
        if span.cat == "kernel":
            row[0] += span.end - span.ts
        elif span.cat == "gpu_memcpy" and "HtoD" in span.name:
            row[1] += 1
            row[2] += "Pageable" in span.name
        elif span.cat == "gpu_memcpy" and "DtoH" in span.name:
            row[3] += 1
    return rows


def _sum_by_name(spans: list[Span]) -> Iterable[tuple[str, int, float]]:
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for s in spans:
        acc[s.name][0] += 1
        acc[s.name][1] += s.end - s.ts
    return ((name, int(c), us) for name, (c, us) in acc.items())


def _top(rows: Iterable[tuple[str, int, float]]) -> list[OpStat]:
    ordered = sorted(rows, key=lambda r: (-r[2], r[0]))
    return [OpStat(name=name, calls=calls, total_ms=us / 1000) for name, calls, us in ordered]


def _memory(trace: RankTrace) -> list[MemoryPeak]:
    capacity = {d.get("id"): d.get("totalGlobalMem") for d in trace.device_properties}
    peaks = []
    for (dev_type, dev_id), peak in sorted(trace.memory_peaks.items()):
        # c10::DeviceType: 0 is CPU, 1 is CUDA.
        if dev_type == 1:
            cap = capacity.get(dev_id)
            peaks.append(MemoryPeak(device=f"cuda:{dev_id}", peak_bytes=peak, capacity_bytes=cap if isinstance(cap, int) else None))
        else:
            peaks.append(MemoryPeak(device="cpu" if dev_type == 0 else f"type{dev_type}:{dev_id}", peak_bytes=peak))
    return peaks
