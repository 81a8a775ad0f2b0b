"""Per-rank analysis: what one rank did in each profiled step, from its trace alone.

How a step's time is split into phases
--------------------------------------
A step is the ``ProfilerStep#N`` span on the *main thread* (the thread that carries those spans). A trace without such
spans (the profiler ran without a schedule) is analysed as the device's active span, cut into iterations where its main
thread repeats (then the busiest thread running the model's forward or an optimizer step); ``RankSummary.window`` and an
issue say so. Every instant of a step is given to exactly one phase, by the first rule below that holds at that instant,
so nested spans are never counted twice and the phases add up to the step time:

 1. ``data``      inside a DataLoader ``__next__`` span (``enumerate(DataLoader)#...`` or ``_next_data``), or where Ray
                  Data's iterator hands over a batch (its Python frames or the agent's stack samples:
                  :mod:`orchestrator.analysis.untraced`), from the step's batch fetch on: the fix is the loader's.
                  Fetches before it (an evaluation's loader) are between steps.
 2. ``sync``      the host waits for the device: a runtime's ``*Synchronize`` (SYCL's ``urQueueFinish``...) or device-to-host copy
                  call, widened to the outermost ``aten::item`` / ``aten::_local_scalar_dense`` / ``aten::to`` /
                  ``aten::copy_`` around it. On a device trace an ``aten::item`` with no such call reads a CPU scalar
                  (Adam's step count) and is no sync; on a CPU-only trace ``aten::item`` is the sync, except where it
                  reads a CPU tensor on a GPU too (:mod:`orchestrator.analysis.cpu_reads`). A pageable upload's own
                  stream sync is a sync only until the device starts the copy (it waits for earlier queued work), then
                  it is the copy's (rule 4). Anomaly detection's NaN checks read too (:mod:`~.anomaly`): not a sync.
 3. ``comm``      inside a collective (``c10d::*``, ``nccl:*``, ``record_param_comms``), or inside gloo's record
                  of a collective's work (``gloo:*``) where the host runs no op of its own: an asynchronous
                  send's record lasts across the next ops (:mod:`orchestrator.analysis.comm_time`).
 4. ``memcpy``    inside a host-to-device copy: a ``cudaMemcpy*`` runtime call whose device copy is HtoD (or unknown),
                  widened to the innermost ``aten::copy_`` / ``aten::_to_copy`` / ``aten::to`` around it (not the
                  allocation beside it). Device-to-device copies never block the host for long: no phase of their own.
 5-7. ``optimizer``, ``backward``, ``forward``: the innermost of these spans open on the main thread decides
                  (:mod:`orchestrator.analysis.phases`), so forward and backward that a closure optimizer runs inside
                  ``Optimizer.step#...`` are forward and backward; where it runs no op while another thread runs
                  backward or a collective, rule 8 decides. ``optimizer``: ``Optimizer.step#...`` / ``zero_grad#...``;
                  ``backward``: autograd nodes (``autograd::engine::evaluate_function: ...``, 1.8's ``...Backward``,
                  ``CompiledFunctionBackward``), compiled autograd's regions or a ``record_function`` such as HTA's
                  ``## backward ##``; ``forward``: a module forward span (``*.forward`` annotations such as
                  ``DistributedDataParallel.forward``, ``## forward ##``, or ``nn.Module:``). Then ``other`` where the
                  loop is in Ray Train's report() or runs Python of its own outside torch (stack samples: never the
                  unmarked forward of rule 9).
 8. The main thread runs no op of its own (an untraced gap, or a ``record_function`` region with no op open in it:
    DualPipe's ``attn(B)`` waits there while the engine's device thread runs the backward chunk). Then the other threads
    of the process say what it waits for: ``backward`` while an autograd thread (a thread that runs backward spans) is
    busy (GPU backward), else ``comm`` while a collective runs on another thread (gloo's worker thread: this is the
    allreduce wait of synchronous data parallelism).
 9. ``forward``   before each backward pass, from the batch's fetch (DataLoader next()) before it, else from the
                  step's start or the previous pass's end: the model and loss, which need not carry any marker
                  (:func:`orchestrator.analysis.phases.unmarked_forward`); accumulation runs one per micro-batch.
10. ``other``     the rest: a checkpoint save, an evaluation or logging before the batch's fetch; clipping, metrics and
                  a weights' average after the last backward (:mod:`~.param_loops`: fastai's own optimizer is ``optimizer``).
Rules 2-4 come before 5-7: a sync, collective or copy costs time wherever it is called from (``.item()`` in forward).

A rank's *communication wait* per step is its ``comm`` phase plus, on GPU, the collective kernel time not overlapped by
compute kernels; in a synchronous allreduce the fast ranks wait for the slowest, so it is largest on fast ranks.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Literal

from orchestrator.analysis.anomaly import nan_checks, step_checks
from orchestrator.analysis.collectives import comm_ops, launched_by, optimizer_comm, own_comm, regathers_per_step
from orchestrator.analysis.comm_time import comm_time
from orchestrator.analysis.cpu_reads import waits_on_a_device
from orchestrator.analysis.cpu_wait import read_thread_time
from orchestrator.analysis.device import DeviceView, WindowGpu, copy_issuer, memory_peaks
from orchestrator.analysis.gc_finding import read_gc
from orchestrator.analysis.generation import generation_of, with_generation
from orchestrator.analysis.idle import HostThread, attribute
from orchestrator.analysis.intervals import Intervals, by_time, clip, cover, intersect, subtract, total, union
from orchestrator.analysis.iterations import recorded_steps, unscheduled_windows
from orchestrator.analysis.loop_settings import trace_loop
from orchestrator.analysis.param_loops import loop_of, optimizer_phase, with_loop
from orchestrator.analysis.phases import (
    Reductions,
    backward_passes,
    batch_fetch,
    collated_ops,
    nested_phases,
    optimizer_impl,
    top_level_ops,
    unmarked_forward,
)
from orchestrator.analysis.profiler_cost import read_steps_before
from orchestrator.analysis.python_frames import HOT_SHARE, callers, enclosing, hot_path, user_frames
from orchestrator.analysis.recompute import recompute_of
from orchestrator.analysis.spans import (
    COPY_OPS,
    DDP_FORWARD,
    GRAD_SCALER_UPDATE,
    HOST_CATEGORIES,
    READING_OPS,
    Kinds,
    by_kind,
    compilations,
    graph_captures,
    is_backward,
    is_comm,
    is_comm_kernel,
    is_copy_call,
    is_data,
    is_device_work,
    is_region,
    is_runtime,
    is_sync,
    regions_within,
    site,
    where,
)
from orchestrator.analysis.step_content import describe_step, loader_class, optimizer_classes
from orchestrator.analysis.threads import Thread, main_thread, walk_thread
from orchestrator.analysis.untraced import (
    RAY_DATA_ITERATOR,
    Timeline,
    Untraced,
    frames_or_samples,
    train_version,
    untraced_waits,
)
from orchestrator.analysis.zero_stage import zero_of
from orchestrator.layout import parse_profiler_step
from orchestrator.models.accelerator import Accelerator
from orchestrator.models.analysis import PHASES, OpStat, Phase, PhaseTimes, RankSummary, StepBreakdown
from orchestrator.traces.loader import PYTHON_FRAME, RankTrace, Span

__all__ = ["TOP_N", "analyze_rank"]

TOP_N = 10
# The frames kept around a DataLoader next(): enough to reach a Trainer's loop past accelerate's and the DataLoader's own.
CALLER_DEPTH = 6

_SCALAR_READS = frozenset({"aten::item", "aten::_local_scalar_dense"})


def analyze_rank(trace: RankTrace, *, top_n: int = TOP_N) -> RankSummary:
    """Steps (or one whole-trace window), phase split, device use, copies, top ops/kernels and memory peaks of one rank."""
    threads: dict[Thread, list[Span]] = defaultdict(list)
    device_spans: list[Span] = []
    frames: dict[Thread, list[Span]] = defaultdict(list)  # with_stack's, only to name the Python outside any op
    for span in trace.spans:
        if is_device_work(span):
            device_spans.append(span)
        elif span.cat in HOST_CATEGORIES:
            threads[(span.pid, span.tid)].append(span)
        elif span.cat == PYTHON_FRAME:
            frames[(span.pid, span.tid)].append(span)
    dev = DeviceView(device_spans)
    # Each thread's spans by (name, category): every rule below is asked once per group.
    kinds = {key: by_kind(spans) for key, spans in threads.items()}

    main_key, step_spans = main_thread(threads, kinds)
    main = threads.get(main_key, []) if main_key is not None else []
    issues: list[str] = []
    window_kind: Literal["profiler_steps", "iterations", "device_span", "whole_trace"] = "profiler_steps"
    if step_spans:
        windows, numbers, cut = recorded_steps(step_spans, trace.recorded)
        issues += [cut] if cut else []
    elif main:
        windows, window_kind, issue = unscheduled_windows(main, device_spans)
        numbers = list(range(len(windows)))
        issues.append(issue)
    else:
        windows, numbers = [], []
        issues.append("no host spans: nothing to analyse")
    # Other threads of the main thread's process: autograd and collective workers.
    other_keys = [k for k in threads if main_key is not None and k != main_key and k[0] == main_key[0]]
    others = [kinds[k] for k in other_keys]
    autograd = [k for k in other_keys if any(is_backward(x[0]) for x in kinds[k].values())]
    main_kinds: Kinds = kinds.get(main_key, {}) if main_key is not None else {}
    process = {k: kinds[k] for k in [main_key, *other_keys] if k is not None}
    checks = nan_checks(process.values())  # anomaly detection's: its reads are no sync of the job's
    check_reads = {id(read) for _, _, read in checks}

    # Walk every thread: the ops' self times; on the main thread, the copies (by direction) and the outermost syncs.
    op_self: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    upload_spans: list[tuple[float, float]] = []
    sync_spans: list[tuple[float, float, str]] = []  # each wait: start, end, the op that waited
    copy_calls: list[Span] = []
    issuers: dict[int, str] = {}  # a copy call's correlation id -> the region and op that issued it
    upload_copy_start = [0.0]  # device start of the latest upload's copy
    regions, around = regions_within(main_kinds, windows)  # regions around a whole step name no reader or issuer

    def on_main(span: Span, ancestors: list[Span]) -> None:
        # On a device, a sync is a runtime call that waits for it (a *Synchronize,
        # or a device-to-host copy) widened to the aten::item / .to() that made it;
        # an aten::item without one reads a CPU scalar. On a CPU trace item() is the sync.
        waits = is_sync(span) and (not device_spans or is_runtime(span))
        if is_copy_call(span):
            copy_calls.append(span)
            if span.correlation is not None:
                issuers[span.correlation] = copy_issuer(ancestors, around)
            direction = dev.copy_by_correlation.get(span.correlation, ("other", None))[0]
            if direction == "DtoH":
                waits = True
            elif direction not in ("DtoD", "PtoP"):
                # The innermost copy op: an enclosing aten::to also allocates, and the first one
                # initialises CUDA (30 s in HTA's AlexNet trace), which no copy fix removes.
                outer = next((a for a in reversed(ancestors) if a.name in COPY_OPS), span)
                upload_spans.append((outer.ts, outer.end))
                upload_copy_start[0] = dev.copy_start.get(span.correlation, span.ts)
        if not waits:
            return
        # On a CPU trace too: the _local_scalar_dense inside an item() is the same read, not a second one.
        # ... else the op that reads by its nature (aten::nonzero: its count's copy and the wait for it are one read).
        outer = next((a for a in [*ancestors, span] if a.name in _SCALAR_READS or a.name in COPY_OPS), None) or next(
            (a for a in reversed(ancestors) if a.name in READING_OPS), span
        )
        if id(outer) in check_reads:
            return
        region = next((a.name for a in reversed(ancestors) if is_region(a) and a.name not in around), None)  # who reads
        # An op that reads back by its nature (x[mask]'s aten::index, if t:'s aten::is_nonzero) names the read.
        reader = next((a.name for a in ancestors if a.name in READING_OPS), outer.name)
        label = site(region, reader)
        if upload_spans and upload_spans[-1][0] <= span.ts and span.end <= upload_spans[-1][1]:
            # A pageable upload syncs its stream: until the device starts the copy the host waits for
            # the work queued before it (in PARAM's DLRM, an all-to-all waiting for late ranks), a sync;
            # from then on it waits for the copy itself.
            waited = (span.ts, min(span.end, upload_copy_start[0]))
            if waited[1] > waited[0]:
                sync_spans.append((*waited, label))
            return
        if any(outer.ts <= s0 and e0 <= outer.end for s0, e0, _ in sync_spans[-1:]):
            return  # a second wait inside the same item() / .to()
        sync_spans.append((outer.ts, outer.end, label))

    # on_main acts on syncs and copy calls only.
    acting = frozenset(name for (name, _), x in main_kinds.items() if is_sync(x[0]) or is_copy_call(x[0]))
    for key, spans in threads.items():
        self_us = walk_thread(spans, on_main if key == main_key else None, acting)
        for span, us in zip(spans, self_us):
            if span.cat == "cpu_op":
                entry = op_self[span.name]
                entry[0] += 1
                entry[1] += us

    step_names = frozenset(name for name, _ in main_kinds if parse_profiler_step(name) is not None)
    backward_elsewhere = union(iv for key in autograd for iv in cover(threads[key]))
    comm_elsewhere = union(iv for by_name in others for iv in where(by_name, is_comm))
    nested = nested_phases(main, main_kinds, step_names, backward_elsewhere, comm_elsewhere, frames.get(main_key, ()))
    if not device_spans:
        sync_spans = waits_on_a_device(sync_spans, nested["optimizer"], main, main_kinds)
    sync_calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for s0, e0, name in sync_spans:
        sync_calls[name][0] += 1
        sync_calls[name][1] += e0 - s0
    sync_rule = union((s0, e0) for s0, e0, _ in sync_spans)
    main_ops = cover((s for s in main if s.cat != "user_annotation"), skip=step_names)
    base_us = trace.file.base_time_ns / 1000
    timeline, unread = Timeline.read(trace.header, base_us)
    (thread_time, _), (gc_pauses, _), (steps_before, _) = agent_wrote = (
        read_thread_time(trace.header), read_gc(trace.header), read_steps_before(trace.header))
    anomaly = step_checks(checks, windows, frames.get(main_key, ()), timeline)
    issues += [why for why in (unread, *(w[1] for w in agent_wrote)) if why]
    untraced = untraced_waits(frames.get(main_key, ()), timeline, gaps := subtract(union(windows), main_ops))
    rules: list[tuple[Phase, Intervals]] = [
        ("data", union([*where(main_kinds, is_data), *untraced[Untraced.RAY_DATA]])),
        ("sync", sync_rule),
        ("comm", comm_time(main, main_kinds)),
        ("memcpy", union(upload_spans)),
        ("optimizer", nested["optimizer"]),
        ("backward", nested["backward"]),
        ("forward", nested["forward"]),
        ("other", untraced[Untraced.TRAIN_REPORT]),  # no forward: the loop's own call, after the step or before the batch
        ("other", untraced[Untraced.PYTHON]),  # the loop's own Python outside torch: last, as its time is read below
    ]
    any_main_span = cover(main, skip=step_names)
    backward_anywhere = union(rules[5][1] + backward_elsewhere)
    op_starts = [s.ts for s in main if s.cat == "cpu_op"]
    reduced = Reductions(kinds.values(), main_kinds)  # what each step's backward passes all-reduce
    seed_starts, compiling = [s.ts for s in main if s.name == "aten::random_"], compilations(main_kinds)  # a new iterator's seed draw

    kernel_us = dev.kernel_us_per_window(windows)
    group_ms, groups = dev.groups(windows)
    steps: list[StepBreakdown] = []
    gpu_rows: list[WindowGpu] = []
    step_heads: list[tuple[float, float] | None] = []  # each step's time before it fetches its batch: work between steps
    python_taken: Intervals = []  # where the steps ran the loop's own Python (the last rule's take)
    for index, (t0, t1) in enumerate(windows):
        remaining: Intervals = [(t0, t1)] if t1 > t0 else []
        phase_us: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        passes = backward_passes(clip(backward_anywhere, t0, t1), op_starts)
        fetch = batch_fetch(t0, t1, passes, rules[0][1], op_starts)
        step_heads.append((t0, fetch) if fetch is not None and fetch > t0 else None)
        for phase, intervals in rules:
            # Another loader's fetches before the step's batch (an evaluation's) are that work's, not data; the rest
            # before it is the work between steps (other, whichever rule takes it), told on its own.
            start = fetch if phase in ("data", "other") and fetch is not None else t0
            taken = intersect(clip(intervals, start, t1), remaining)
            phase_us[phase] += total(taken)
            remaining = subtract(remaining, taken)
        python_taken += (python := taken)  # the last rule's: the loop's own Python
        # Rule 8: the main thread runs no op of its own.
        idle = subtract(remaining, clip(main_ops, t0, t1))
        for phase, intervals in (("backward", backward_elsewhere), ("comm", comm_elsewhere)):
            taken = intersect(clip(intervals, t0, t1), idle)
            phase_us[phase] += total(taken)
            remaining = subtract(remaining, taken)
            idle = subtract(idle, taken)
        forward = unmarked_forward(t0, t1, remaining, passes, rules[0][1])
        phase_us["forward"] += total(forward)
        phase_us["other"] += total(remaining) - total(forward)
        head = clip(remaining, t0, fetch) if fetch is not None else []

        row = dev.window(t0, t1, kernel_us[index]) if device_spans else None
        if row is not None:
            gpu_rows.append(row)
        steps.append(
            StepBreakdown(
                step=numbers[index],
                start_unix_us=base_us + t0,
                duration_ms=(t1 - t0) / 1000,
                phases=PhaseTimes(**{p: v / 1000 for p, v in phase_us.items()}),
                between_ms=total(head) / 1000,
                between_ops_ms=total(intersect(head, clip(main_ops, t0, t1))) / 1000,
                between_fetches=len(clip(rules[0][1], t0, fetch)) if fetch is not None else 0,
                between_seeds=sum(t0 <= t < fetch for t in seed_starts) if fetch is not None else 0,
                sync_calls=len(clip(sync_rule, t0, t1)),
                report_ms=total(clip(untraced[Untraced.TRAIN_REPORT], t0, t1)) / 1000, compile_ms=total(clip(compiling, t0, t1)) / 1000,
                python_ms=total(python) / 1000,
                copy_calls=len(clip(rules[3][1], t0, t1)), anomaly=anomaly[index],
                backward=reduced.of(passes),
                gpu_busy_ms=row.busy / 1000 if row else None,
                kernel_ms=row.kernel / 1000 if row else None,
                comm_kernel_ms=row.comm / 1000 if row else None,
                comm_exposed_ms=row.exposed / 1000 if row else None,
                group_comm_ms=group_ms[index],
            )
        )

    python_path: tuple[int, list[OpStat]] = (0, [])
    if timeline is not None:
        paths = timeline.paths([[h] if h else [] for h in step_heads], windows)
        python_path = timeline.paths([python_taken], windows, at_line=True)[0]
        steps = [s.model_copy(update={"between_samples": n, "between_frames": hot}) for s, (n, hot) in zip(steps, paths)]
    training_data = subtract(rules[0][1], union(h for h in step_heads if h is not None))  # the loads of the batches the steps train on
    param = loop_of(main, windows, backward_anywhere, nested["optimizer"], rules[0][1], op_starts, frames.get(main_key, ()), timeline)
    steps = optimizer_phase(steps, param)  # a framework's own optimizer, which no torch.optim span marks
    durations = [s.duration_ms for s in steps]
    mean_phases = PhaseTimes(**{p: sum(s.phases.get(p) for s in steps) / len(steps) if steps else 0.0 for p in PHASES})
    calls = [(key, s) for key, by_name in kinds.items() for group in by_name.values() if is_runtime(group[0]) for s in group]
    launches = {s.correlation: (s.ts, s.end, key) for key, s in calls if s.correlation is not None}
    whole = window_kind != "profiler_steps"  # HTA's active span is then the whole trace, however it is cut
    named = launched_by([s for s in device_spans if is_comm_kernel(s)], launches, kinds) if device_spans else {}
    gpu_stats = dev.stats(windows, gpu_rows, launches, whole=whole, launched_by=named) if device_spans and windows else None
    idle, main_frames = None, user_frames(frames.get(main_key, ()))  # Python outside ops and the reads are main's
    gen = generation_of(stepped := frames_or_samples(main_frames, timeline, list(windows)), windows)
    loading = [iv for t0, t1 in windows for iv in clip(training_data, t0, t1)]
    reads = [iv for t0, t1 in windows for iv in clip(sync_rule, t0, t1)]  # each read's wait
    if device_spans and windows:
        main_host = HostThread(
            data=training_data, sync=sync_rule, copy=rules[3][1], collective=rules[2][1],
            runtime=union(where(main_kinds, is_runtime)), busy=any_main_span, elsewhere=comm_elsewhere,
            steps=windows if step_spans else [], spans=main, skip=step_names | around, regions=with_loop(with_generation(regions, gen), param),
            optimizer=nested["optimizer"], capture=graph_captures(main_kinds), compile=compiling,
            frames=frames_or_samples(main_frames, timeline, gaps),  # samples stand in for stacks
        )
        idle, idle_rows = attribute(
            device_spans, windows, launches, lambda key: main_host if key == main_key else HostThread.other(threads[key], kinds[key], windows),
            main_key, {s.correlation: s.name for _, s in calls if s.correlation is not None}, union((a.ts, c.end) for a, _, c in checks))
        steps = [s.model_copy(update={"idle_ms": row}) for s, row in zip(steps, idle_rows)]
    comm_wait = mean_phases.comm + (gpu_stats.comm_exposed_ms_per_step if gpu_stats else 0.0)
    # As rule 8 counts them: a wait inside an annotation (DDP's forward around Lightning's sync_dist) is a wait too.
    waits = union(rules[2][1] + intersect(comm_elsewhere, subtract(list(windows), main_ops)))
    model_time = union(nested["forward"] + backward_anywhere) if backward_anywhere else []
    own_optimizer = [iv for t0, t1 in windows for iv in clip(nested["optimizer"], t0, t1)]
    collectives = comm_ops(main_kinds, windows, own_optimizer)

    def launched(calls: Intervals) -> float:
        return dev.exposed_launched_in(windows, calls, launches, main_key) if device_spans else 0.0

    own, own_waits = own_comm(main_kinds, windows, model_time, waits, launched) or (None, [])
    zero = zero_of(stepped)  # a DeepSpeed engine's reduction
    return RankSummary(
        rank=trace.file.rank, host=trace.file.host, file=trace.file.path.name, device=trace.device,
        accelerator=Accelerator.of(trace.device_properties, trace.device), unrecorded_device=trace.unrecorded, window=window_kind, steps=steps,
        mean_step_ms=sum(durations) / len(durations) if steps else None, median_step_ms=statistics.median(durations) if steps else None,
        mean_phases=mean_phases, comm_wait_ms=comm_wait,
        ray_train=train_version(frames.get(main_key, ()), timeline),
        data_loader=loader_class(main_kinds) or (RAY_DATA_ITERATOR if untraced[Untraced.RAY_DATA] else None), ddp=DDP_FORWARD in main_kinds, grad_scaler=GRAD_SCALER_UPDATE in main_kinds,
        sync_ops=by_time(sync_calls),
        sync_callers=callers(frames_or_samples(main_frames, timeline, reads), reads),
        data_frames=hot_path(frames_or_samples(main_frames, timeline, loading), loading, HOT_SHARE),
        python_samples=python_path[0], python_frames=python_path[1],
        data_callers=enclosing(main_frames, loading, CALLER_DEPTH),
        data_ops=collated_ops(main, loading) / max(len(windows), 1),
        comm_ops=collectives,
        own_comm=own, optimizer_comm=optimizer_comm(main_kinds, windows, own_optimizer, waits, launched), own_comm_callers=callers(frames_or_samples(main_frames, timeline, own_waits), own_waits),
        zero_stage=zero.stage, zero_bf16_optimizer=zero.bf16_optimizer,
        regathers_per_step=regathers_per_step(main_kinds, windows),
        gpu=gpu_stats, idle=idle,
        copies=dev.copies(windows, copy_calls, issuers) if windows else [],
        process_groups=groups,
        top_ops=by_time(op_self)[:top_n], top_kernels=dev.top_kernels(windows, top_n), memory=memory_peaks(trace),
        step_definition=describe_step(main_kinds, windows, backward_anywhere),
        loop=trace_loop(trace.header, frames.get(main_key, ())),
        thread_time=thread_time, steps_before=steps_before, gc=gc_pauses, recompute=recompute_of(process, windows, dev if device_spans else None, launches),
        param_loop=param, generation=gen, issues=issues,
        optimizers=optimizer_classes(main_kinds, windows), optimizer_impl=optimizer_impl(main_kinds, own_optimizer),
        # Asked of CPU-only traces only (the optimizer_host finding): a pass over the main thread's spans.
        optimizer_ops=0.0 if device_spans else top_level_ops(main, own_optimizer) / max(len(windows), 1),
    )
