"""Advice from the evidence: the device idle time no finding of its own claims, split into named causes,
each with the fix that removes it.

The idle attribution (:mod:`orchestrator.analysis.idle`) says what the host did while the
device idled: ``cpu`` and ``runtime`` name the innermost op or call and the optimizer step or
``record_function`` region around it, ``launch`` the region it falls in. Here those become
causes a fix can point at, each with its idle ms per step:

* ``optimizer``: host time in ``Optimizer.step`` / ``zero_grad`` (its ops and its launch pace):
  a fused or foreach optimizer (time in a loop over tensors the param_loop finding tells, fastai's own optimizer or
  a weights' average, is that finding's: :func:`told_idle_ms`; so is generation's);
* ``region``: host time in one of the user's ``record_function`` regions (its ops and Python):
  keep its work on the device, or off the step;
* ``allocator``: ``cudaMalloc`` / ``cudaFree`` / ``hipMalloc``...: the caching allocator;
* ``launch_calls``: slow launch calls (``cudaLaunchKernel`` / ``hipLaunchKernel`` that take the
  runtime's own time), and ``launch``: kernels launched no faster than they run (outside the
  optimizer): CUDA graphs, ``torch.compile``, a larger batch;
* ``runtime_calls``: other runtime calls (events, streams), named;
* ``first_use``: runtime calls that take ``FIRST_USE_CALL_MS`` or more each (creating the CUDA
  context, loading a module at its first launch, a first large allocation): paid once, no loop fix;
* ``ops``: the model's own host ops the device waits for (outside the optimizer and the regions), one cause
  for all of them, as one fix serves them all (fewer, bigger ops), the largest named; ``op`` where it is one op;
  where their largest launches no device work and holds half their time, it computes on CPU tensors: its input
  on the device, or the op off the step (:func:`host_op`);
* ``data_prep``, ``bookkeeping``, ``ray_call``, ``python``: in a ``with_stack`` trace or one with the agent's stack samples
  (:meth:`~orchestrator.analysis.untraced.Timeline.frames`), the Python functions the host runs outside
  any op (innermost frame of the user's or a library's code, :mod:`~orchestrator.analysis.python_frames`), by what
  the largest is (:mod:`~orchestrator.analysis.python_fix`): the data's preparation into DataLoader workers, logging
  every N steps, a Ray call a step ahead, the rest off the step or onto the device;
* ``queued``: work already launched that waits on a stream or event dependency (in a replayed graph, most
  likely nodes the profiler missed: a graph captured before its first use);
* ``capture``: recording CUDA/HIP graphs (their kernels run only at replay), and ``compile``: torch.compile
  compiling: warm-up, no loop fix (:func:`paid_once`), unless most steps record or compile again (new shapes).

Time the profiler cannot name (Python outside any op without stacks, untraced time) counts in a finding's bound
but is no cause: no fix can be told from it. An op inside the optimizer step or a region is that
cause's, never the model's too; the causes decide the advice and the warning, and the bound leaves out only
what the loop pays once (:func:`paid_once`): no change to the loop saves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from orchestrator.analysis.compile_finding import RECOMPILE_FIX, WARM_UP
from orchestrator.analysis.finding_base import first_use_examples, ms_list, runtime_of
from orchestrator.analysis.generation import GENERATION_REGION, ROLLOUT_REGION
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.optimizer_fix import optimizer_fix
from orchestrator.analysis.param_loops import LOOP_REGION
from orchestrator.analysis.python_fix import PythonKind, python_fix, python_kind
from orchestrator.analysis.python_frames import frame_label
from orchestrator.analysis.spans import is_compiled_name, site_parts
from orchestrator.models.analysis import IdleCause, OpStat, RankSummary

__all__ = ["Cause", "fix_for", "host_op", "named_causes", "once_note", "paid_once", "round_trips", "told_idle_ms"]

# Regions whose device idle time a finding of its own tells: a loop over tensors (param_loop), rollouts (generation, rollout).
_TOLD = (LOOP_REGION, GENERATION_REGION, ROLLOUT_REGION)

Kind = (
    Literal["optimizer", "region", "allocator", "launch_calls", "runtime_calls", "first_use", "launch", "op", "ops", "queued", "capture", "compile"]
    | PythonKind
)
_PYTHON: tuple[PythonKind, ...] = get_args(PythonKind)
# cudaMalloc, cudaFree, cudaHostAlloc, cudaHostRegister; hipMalloc...; an Intel GPU's urUSMDeviceAlloc, urUSMFree.
_ALLOCATOR = ("Malloc", "Free", "Alloc", "HostRegister")
# Idle ms per call from which a runtime call is a first use, not the loop's pace. In every real trace at hand the
# calls a loop repeats leave the device idle at most 1.3 ms a call (launches 4-55 µs, events 2 µs, cudaMalloc
# 0.2-0.7 ms, one cudaMemsetAsync 1.3 ms), while first uses take 6.5 ms (a hipLaunchKernel loading its module) to
# seconds (cudaFree creating the CUDA context in PARAM's warm-up forward: 5 calls of 1.3 s on average).
FIRST_USE_CALL_MS = 5.0
# Allocator calls per step from which the caching allocator looks switched off: with it on, a step reaches the
# driver only for new segments (the H100 recording that calls empty_cache() every step: 11 calls a step); with it
# off, for every tensor (TraceLens' MI300 ResNet-18 trace "no_pool": 437 hipFree / hipMalloc calls a step).
UNCACHED_CALLS_PER_STEP = 50
# Share of the model ops' idle time from which an op that launches no device work leads their advice (host_op).
HOST_OP_SHARE = 0.5


@dataclass(frozen=True)
class Cause:
    """One named, actionable cause of device idle time on a rank, in ms per analysed step."""

    kind: Kind
    name: str
    ms: float
    sources: tuple[IdleCause, ...]
    """The idle causes its time is drawn from (per step in ``StepBreakdown.idle_ms``)."""
    calls: float = 0.0
    """allocator, first_use: its runtime calls per step (the idle pieces they are innermost in)."""
    lead_ms: float = 0.0
    """op, ops, python: the ms per step of its largest op or function (the group's weight for a warning: :meth:`weight_ms`)."""
    frames: tuple[str, ...] = ()
    """data_prep, bookkeeping, python: the Python frames it names."""

    @property
    def per_call_ms(self) -> float:
        return self.ms / self.calls if self.calls else 0.0

    @property
    def weight_ms(self) -> float:
        """What the cause weighs when a finding decides to warn: the model's ops weigh as their largest op, as the
        host cost of many small ops spread over the model is eager PyTorch's baseline (the TensorBoard plugin's
        fixed ResNet-50, device busy 72%: 15.5 ms a step over hundreds of ops, 4.2 ms the largest), while one op
        that holds a share of the step is a defect of its own."""
        return self.lead_ms if self.kind in ("op", "ops", *_PYTHON) else self.ms

    def verb(self, singular: str, plural: str) -> str:
        """``singular`` for a cause named by one call or op, ``plural`` for a list of them ("cudaFree, cudaMalloc")."""
        return plural if ", " in self.name else singular


def _per_step(r: RankSummary, ops: Iterable[OpStat]) -> dict[str, float]:
    n = max(len(r.steps), 1)
    return {o.name: o.total_ms / n for o in ops}


def named_causes(r: RankSummary, exclude: Iterable[IdleCause] = ()) -> list[Cause]:
    """The named causes of ``r``'s device idle time among its idle causes not in ``exclude``, largest first."""
    if r.idle is None:
        return []
    skip = set(exclude)
    shares = {c.cause: c for c in r.idle.causes if c.cause not in skip}
    optimizer = 0.0
    regions: dict[str, float] = {}
    # Runtime calls in a region are the allocator's or the launches' (below), not the region's.
    for cause in ("cpu", "launch"):
        if cause in shares:
            for name, ms in _per_step(r, shares[cause].regions).items():
                if name.startswith(_TOLD):
                    continue  # the param_loop or generation finding's
                if name.startswith("Optimizer."):
                    optimizer += ms
                elif cause == "cpu":
                    regions[name] = regions.get(name, 0.0) + ms
    out = [Cause("optimizer", "the optimizer step", optimizer, ("cpu", "launch"))] if optimizer > 0 else []
    out += [Cause("region", name, ms, ("cpu",)) for name, ms in regions.items()]
    if "runtime" in shares:
        steps = max(len(r.steps), 1)
        first = [o for o in shares["runtime"].top if o.calls and o.total_ms / o.calls >= FIRST_USE_CALL_MS] if _once(r) else []
        if first:
            total, n = sum(o.total_ms for o in first), sum(o.calls for o in first)
            out.append(Cause("first_use", ", ".join(o.name for o in first[:3]), total / steps, ("runtime",), n / steps))
        calls = _per_step(r, [o for o in shares["runtime"].top if o not in first])
        alloc = {n: ms for n, ms in calls.items() if any(k in n for k in _ALLOCATOR)}
        if alloc:
            alloc_calls = sum(o.calls for o in shares["runtime"].top if o.name in alloc)
            out.append(
                Cause("allocator", ", ".join(sorted(alloc, key=lambda n: -alloc[n])[:3]), sum(alloc.values()), ("runtime",), alloc_calls / steps)
            )
        out += [
            Cause("launch_calls" if "Launch" in n else "runtime_calls", n, ms, ("runtime",)) for n, ms in calls.items() if n not in alloc
        ]
    if "launch" in shares:
        in_optimizer = sum(ms for n, ms in _per_step(r, shares["launch"].regions).items() if n.startswith(("Optimizer.", *_TOLD)))
        out.append(Cause("launch", "launch pace", max(shares["launch"].ms_per_step - in_optimizer, 0.0), ("launch",)))
    if "cpu" in shares and shares["cpu"].model_ops:
        ops = shares["cpu"].model_ops
        steps = max(len(r.steps), 1)
        listed = ms_list((o.name[:60], o.total_ms / steps) for o in ops)
        name = ops[0].name if len(ops) == 1 else "the model's ops" + (f" ({listed})" if listed else "")
        kind: Kind = "op" if len(ops) == 1 else "ops"
        out.append(Cause(kind, name, shares["cpu"].model_ops_ms / steps, ("cpu",), lead_ms=ops[0].total_ms / steps))
    # The function a told stretch names (its region's name, after the prefix) is that finding's, as the stretch is.
    owners = {n.name[len(p):] for c in ("cpu", "launch") if c in shares for n in shares[c].regions for p in _TOLD if n.name.startswith(p)}
    frames = [f for f in shares["cpu"].python_frames if frame_label(f.name) not in owners] if "cpu" in shares else []
    if frames:
        steps, gone = max(len(r.steps), 1), sum(f.total_ms for f in shares["cpu"].python_frames if f not in frames)
        listed = ms_list((frame_label(f.name, 90), f.total_ms / steps) for f in frames)
        out.append(Cause(
            python_kind(frames[0].name), "Python functions" + (f" ({listed})" if listed else ""),
            (shares["cpu"].python_frames_ms - gone) / steps, ("cpu",), lead_ms=frames[0].total_ms / steps, frames=tuple(f.name for f in frames),
        ))
    if "queued" in shares:
        out.append(Cause("queued", "queued work", shares["queued"].ms_per_step, ("queued",)))
    if "capture" in shares:
        out.append(Cause("capture", "CUDA/HIP graph capture", shares["capture"].ms_per_step, ("capture",)))
    if "compile" in shares:
        out.append(Cause("compile", "torch.compile's compilation", shares["compile"].ms_per_step, ("compile",)))
    return sorted((c for c in out if c.ms > 0), key=lambda c: -c.ms)


def told_idle_ms(r: RankSummary, region: str) -> float:
    """The device idle ms per step in the stretches named ``region`` and after (a loop over tensors: :func:`~.param_loops.with_loop`;
    generation: :func:`~.generation.with_generation`): a finding of its own's, as the DataLoader's wait is the
    dataloader_bound finding's. Their host ops and launch pace, the causes :func:`named_causes` leaves out for them (a
    runtime call is named by the call, in a stretch or not)."""
    if r.idle is None:
        return 0.0
    return sum(
        ms for c in r.idle.causes if c.cause in ("cpu", "launch")
        for name, ms in _per_step(r, c.regions).items() if name.startswith(region)
    )


def _once(r: RankSummary) -> bool:
    """Slow runtime calls leave the device idle in at most one step: they can be a first use. Where they recur
    (several steps each idle that long in runtime calls: empty_cache and fresh allocations every step, say), they
    are the loop's."""
    return sum(1 for s in r.steps if s.idle_ms.get("runtime", 0.0) >= FIRST_USE_CALL_MS) <= 1


def _steps_in(r: RankSummary, cause: IdleCause) -> int:
    """How many of ``r``'s steps have idle time for ``cause`` (0 where its windows are no ProfilerSteps: one trace's
    iterations then, an inference server's warm-up capturing one graph per batch size in vLLM's traces)."""
    return sum(1 for s in r.steps if s.idle_ms.get(cause, 0.0) > 0) if r.window == "profiler_steps" else 0


def paid_once(cause: Cause, r: RankSummary) -> bool:
    """A cause no change to the loop removes, as the loop pays it once: a first use, or graphs captured or code
    compiled in at most half the steps (recorded or compiled once, then replayed or run)."""
    if cause.kind in ("capture", "compile"):
        steps = _steps_in(r, cause.sources[0])
        return steps < 2 or steps * 2 <= len(r.steps)
    return cause.kind == "first_use"


def once_note(cause: Cause) -> str:
    """A cause paid once, named without its fix where a steady cause's fix is told first."""
    if cause.kind in ("capture", "compile"):
        return f" {cause.name} ({cause.ms:.1f} ms per step) is warm-up: no fix is told for it."
    return f" {cause.name} {cause.verb('takes', 'take')} {cause.per_call_ms:.0f} ms a call, a first use's cost: no fix is told for it."


def round_trips(r: RankSummary) -> dict[str, float]:
    """Regions that copy pageable memory to the host and back, with the device ms per step of those copies."""
    n = max(len(r.steps), 1)
    by_dir: dict[str, dict[str, float]] = {"DtoH": {}, "HtoD": {}}
    for c in r.copies:
        if c.direction in by_dir and c.host_memory == "pageable":
            for o in c.issued_by:
                region = site_parts(o.name)[0]
                if region is not None:
                    by_dir[c.direction][region] = by_dir[c.direction].get(region, 0.0) + o.total_ms / n
    return {name: ms + by_dir["HtoD"][name] for name, ms in by_dir["DtoH"].items() if name in by_dir["HtoD"]}


def fix_for(cause: Cause, r: RankSummary, after: Cause | None = None) -> str:
    """The concrete change that removes ``cause``, with its figure (``after``: the cause whose fix is told before it)."""
    figure = f"{cause.ms:.1f} ms per step"
    words = runtime_of(r.device)
    torch_ = words.module
    if (host := host_op(cause, r)) is not None:
        steps = max(len(r.steps), 1)
        calls = host.calls / steps
        cpu = r.idle.get("cpu") if r.idle is not None else None
        where = f", called in {frame_label(cpu.host_op_callers[0].name, 90)}" if cpu is not None and cpu.host_op_callers else ""
        return (
            f"{host.name} runs on the host and launches no kernel while the device idles ({host.total_ms / steps:.1f} ms "
            f"per step in {calls:g} call{'' if calls == 1 else 's'}{where}): it computes on CPU tensors. Keep its input on the device (move "
            "the .cpu(), .numpy() or .tolist() after it; create tensors with device=), or move it off the step (a "
            "DataLoader worker, a background thread, or every N steps)."
        )
    if after is not None and {cause.kind, after.kind} == {"ops", "launch"} and host_op(after, r) is None:
        # Launch pace and the model's per-op host cost are cut by the same change (fewer, bigger kernels), just told.
        if cause.kind == "launch":
            return f"Kernels are launched no faster than they run ({figure} of launch-bound idle): the same changes cut it."
        return f"The host's own time in {cause.name} leaves the device idle {figure}: the same changes cut it."
    if cause.kind == "optimizer":
        return optimizer_fix(r, figure)
    if cause.kind == "region":
        trip = round_trips(r).get(cause.name)
        if trip is not None:
            return (
                f"The region {cause.name!r} leaves the device idle {figure} and copies to the host and back "
                f"({trip:.1f} ms of pageable copies per step): compute it on the device (torch.nonzero / torch.argwhere / "
                "boolean masks on the device tensor) and drop the .cpu() / .numpy() round trip."
            )
        return (
            f"The host runs the region {cause.name!r} while the device idles ({figure}): keep its work on the device, "
            "or move it off the step (a background thread, or every N steps)."
        )
    if cause.kind == "allocator" and cause.calls >= UNCACHED_CALLS_PER_STEP:
        return (
            f"{cause.name} {cause.verb('leaves', 'leave')} the device idle {figure} in {cause.calls:.0f} calls a step, about one per tensor: the "
            "caching allocator looks switched off: unset PYTORCH_NO_CUDA_MEMORY_CACHING (PYTORCH_NO_HIP_MEMORY_CACHING on "
            f"ROCm), or drop {torch_}.caching_allocator_enable(False), so freed memory is reused instead of going back to "
            f"the driver; if it is on, no {torch_}.empty_cache() in the loop."
        )
    if cause.kind == "allocator":
        return (
            f"{cause.name} {cause.verb('leaves', 'leave')} the device idle {figure}: let PyTorch's caching allocator reuse memory: no "
            f"{torch_}.empty_cache() in the loop, no tensors allocated anew each iteration (preallocate and reuse "
            "buffers)" + (f", {words.expandable_segments} against fragmentation." if words.expandable_segments else ".")
        )
    if cause.kind == "runtime_calls":
        return (
            f"The runtime call {cause.name} leaves the device idle {figure}: look for where it is called each step "
            "(event polling, stream creation) and hoist it out of the loop."
        )
    if cause.kind == "first_use":
        return (
            f"{cause.name} {cause.verb('takes', 'take')} {cause.per_call_ms:.0f} ms a call while the device idles ({figure}): the cost of a "
            f"first use, not of the loop ({first_use_examples(r.device)}). No change to the loop removes it: profile "
            "steps after warm-up (a later window) to judge the steady state."
        )
    if cause.kind == "capture" and paid_once(cause, r):
        return (
            f"The host records CUDA/HIP graphs while the device idles ({figure}): kernels launched in a capture run only "
            "when the graph is replayed, so a capture is warm-up (torch.cuda.graph, the first calls of "
            "torch.compile(mode='reduce-overhead'), an inference server capturing its graphs), not the steady state. "
            "Profile steps after it (a later window) to judge the loop."
        )
    if cause.kind == "capture":
        return (
            f"The host records CUDA/HIP graphs in {_steps_in(r, 'capture')} of {len(r.steps)} steps while the device idles ({figure}): "
            "graphs recorded again are not replayed. Keep the inputs' shapes fixed (pad to a few sizes, drop_last=True "
            "on the DataLoader, torch._dynamo.mark_dynamic on a dimension that varies) and read why Inductor records "
            "again with TORCH_LOGS=cudagraphs."
        )
    if cause.kind == "compile" and paid_once(cause, r):
        return (
            f"torch.compile compiles while the device idles ({figure}): a first call's cost {WARM_UP}"
        )
    if cause.kind == "compile":
        return (
            f"torch.compile compiles again in {_steps_in(r, 'compile')} of {len(r.steps)} steps while the device idles "
            f"({figure}): {RECOMPILE_FIX}"
        )
    if cause.kind == "launch_calls":
        return (
            f"Launch calls ({cause.name}) take the runtime's own time while the device idles ({figure}): launch fewer, "
            "bigger kernels: " + ("CUDA/HIP graphs (torch.compile(mode='reduce-overhead')), " if words.graphs else "")
            + "torch.compile to fuse small kernels, a larger batch."
        ) + in_loop(r.loop, [Change.COMPILE])
    if cause.kind == "launch":
        return (
            f"Kernels are launched no faster than they run ({figure} of launch-bound idle): give the device more work "
            "per launch: " + ("CUDA graphs (torch.compile(mode='reduce-overhead')), " if words.graphs else "")
            + "torch.compile to fuse small kernels, a larger batch."
        ) + in_loop(r.loop, [Change.COMPILE])
    if cause.kind in _PYTHON:
        told = f"{cause.name} run outside any op while the device idles ({figure})"
        return python_fix(cause.kind, cause.frames, told, r.device, idles=True)
    if cause.kind == "queued" and (graphs := _in_graph_replays(r)) >= cause.ms / 2:
        return (
            f"The device had work queued and still idled ({figure}), {graphs:.1f} ms of it in replays of CUDA/HIP graphs: "
            "the trace shows nothing running before or between a graph's nodes. A graph captured before the profiler's "
            "first use runs kernels the profiler misses or mistimes (pytorch#100441, kineto#1165): call "
            "torch.profiler._utils._init_for_cuda_graphs() before capturing (torch.compile's mode='reduce-overhead' "
            "captures in its first steps) and profile again to see what the graphs run; if they still idle, look for "
            "event waits on other streams inside the capture."
        )
    if cause.kind == "queued":
        return (
            f"The device had work queued and still idled ({figure}): look for cross-stream waits ({words.stream_wait}, "
            "record_stream), " + ("CUDA-graph nodes that wait on the host, " if words.graphs else "")
            + "and work the profiler did not record (other processes on the device)."
        )
    if cause.kind in ("op", "ops") and is_compiled_name(cause.name) and r.idle is not None and r.idle.get("capture"):
        return (
            f"The host's own time in {cause.name} leaves the device idle {figure}: the model is compiled and this window "
            "records its CUDA graphs too, so these runs are warm-up (CUDA graph trees run a graph once before recording "
            "it). Profile later steps; where a graph still runs outside a CUDA graph there, TORCH_LOGS=cudagraphs says "
            "why Inductor skipped it."
        )
    if cause.kind in ("op", "ops") and is_compiled_name(cause.name):
        return (
            f"The host's own time in {cause.name} leaves the device idle {figure}: the model is compiled, and the host "
            "runs its graphs no faster than the device: "
            + ("replay them as CUDA graphs (torch.compile(mode='reduce-overhead')), " if words.graphs else "")
            + "cut graph breaks (torch._dynamo.explain) so fewer graphs run, or a larger batch per step."
        )
    if cause.kind == "ops":
        return (
            f"The host's own time in {cause.name} leaves the device idle {figure}: each op costs the host more than "
            "its kernels take on the device: torch.compile the model (fewer, fused kernels"
            + ("; mode='reduce-overhead' replays them as a CUDA graph" if words.graphs else "")
            + "), a larger batch per step, no Python loops over tensors."
        ) + in_loop(r.loop, [Change.COMPILE])
    return (
        f"The host op {cause.name} leaves the device idle {figure}: cut the host's per-op overhead on the step "
        "(torch.compile, fewer small ops, no Python loops over tensors) or make the op run on the device."
    )


def host_op(cause: Cause, r: RankSummary) -> OpStat | None:
    """The op that leads the model's ops (``cause``: op or ops) where it launched no device work and holds
    HOST_OP_SHARE of their idle time or more: it computes on the host, and per-op overhead is not its story (TraceLens'
    MI300 OWLv2 pipeline: torch.max over CPU scores, 40.4 of 46.1 ms a step). A CUDA or ROCm trace's only: they tie
    each launch to its call."""
    cpu = r.idle.get("cpu") if r.idle is not None else None
    if cause.kind not in ("op", "ops") or r.device not in ("cuda", "rocm", "xpu") or cpu is None or not cpu.model_ops:
        return None
    lead = cpu.model_ops[0]
    if lead.name not in cpu.host_only_ops or lead.total_ms / max(len(r.steps), 1) < HOST_OP_SHARE * cause.ms:
        return None
    return lead


def _in_graph_replays(r: RankSummary) -> float:
    """Queued idle ms per step whose waiting work a graph launch started (``cudaGraphLaunch``, ``hipGraphLaunch``)."""
    queued = r.idle.get("queued") if r.idle is not None else None
    return sum(o.total_ms for o in queued.top if "GraphLaunch" in o.name) / max(len(r.steps), 1) if queued else 0.0
