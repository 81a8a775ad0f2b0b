"""What a span is: the name and category rules every analysis module shares.

One home for "is this a sync / a collective / backward / a copy, and which
kind": the phase split (:mod:`orchestrator.analysis.rank`) and the device
statistics (:mod:`orchestrator.analysis.device`) ask these functions, never
the names directly.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence

from orchestrator.analysis.intervals import Intervals, union
from orchestrator.models.analysis import CollectiveKind
from orchestrator.traces.categories import (
    FUNCTIONAL_COLLECTIVE_PREFIXES,
    HOST_COLLECTIVE_PREFIXES,
    RUNTIME_CATEGORIES,
    starts_copy,
)
from orchestrator.traces.loader import Span

__all__ = [
    "COPY_OPS",
    "DDP_FORWARD",
    "GRAD_SCALER_UPDATE",
    "HOST_CATEGORIES",
    "OPTIMIZER_STEP",
    "READING_OPS",
    "SIZED_BY_DATA",
    "SYNCHRONIZE_CALLS",
    "TENSOR_CONDITIONS",
    "site",
    "site_parts",
    "collective_kind",
    "collective_of",
    "Kinds",
    "by_kind",
    "compilations",
    "graph_captures",
    "is_backward",
    "is_comm",
    "is_functional",
    "is_comm_kernel",
    "is_comm_kernel_name",
    "is_compute_kernel",
    "is_device_work",
    "is_compiled_name",
    "is_copy_call",
    "is_data",
    "is_forward",
    "is_marker_name",
    "is_optimizer",
    "is_region",
    "regions_within",
    "is_runtime",
    "is_sync",
    "where",
]

# Spans by (name, category): what every rule here reads, so a rule is asked once per group, not once per span.
Kinds = dict[tuple[str, str], list[Span]]

# The runtime's own waits: named as a read when no op makes them (torch.cuda.synchronize(), a stream's or event's).
SYNCHRONIZE_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        # Intel GPUs: torch.xpu.synchronize() and a stream's wait finish the SYCL queue, an event's wait waits for it
        # (Unified Runtime's names, recorded by PTI 0.11 and later; SYCL's PI names before; Level Zero's below them).
        "urQueueFinish",
        "urEventWait",
        "piQueueFinish",
        "piEventsWait",
        "zeCommandQueueSynchronize",
        "zeCommandListHostSynchronize",
        "zeEventHostSynchronize",
        "zeFenceHostSynchronize",
    }
)
_SYNC_NAMES = frozenset({"aten::item", "aten::_local_scalar_dense"}) | SYNCHRONIZE_CALLS
_COMM_PREFIXES = (
    *HOST_COLLECTIVE_PREFIXES,
    # FSDP2's own collective regions (fully_shard): issuing the all-gather and the reduce-scatter, copying their
    # buffers in and out, and waiting for them. On a CPU (gloo) the host blocks in them while a gloo thread moves
    # the data; without these names that wait read as forward and backward (a 97 ms CPU step: backward 59 ms,
    # collectives 4.7 ms, where its gloo threads moved data for ~40 ms).
    "FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::post_backward_rs_wait",
)
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
# torch.optim's profiling hook names each step "Optimizer.step#<Class>.step".
OPTIMIZER_STEP = "Optimizer.step#"
# Device-side work: CUDA/ROCm kernels, copies and memsets, MTIA's command processor events.
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
# MTIA's command processor also records a stream waiting for another's event, and the records it waits for: a
# stream standing still, as CUDA's device-side syncs (category cuda_sync, never device work) are.
_MTIA_STREAM_SYNC = frozenset({"event_wait", "event_record"})
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"}) | RUNTIME_CATEGORIES
# A record_function or autograd node that names backward: "## backward ##",
# "autograd::engine::evaluate_function: AddmmBackward0", PyTorch 1.8's "CudnnConvolutionBackward".
_BACKWARD = re.compile(r"backward|autograd::engine::evaluate_function", re.IGNORECASE)
_COMPILED_AUTOGRAD = "Torch-Compiled Region: !"
_COMPILED_HOST = ("CompiledFunction", "CompiledFxGraph", "Torch-Compiled Region", "TorchDynamo Cache Lookup")
# HTA's split of device work (hta.utils.utils.get_kernel_type), so that shares agree with it, and the libraries that move
# data between GPUs with kernels of their own, which HTA counts as compute: they wait for peers like NCCL's do, so tuning
# them as compute is the wrong fix (DeepSeek's public DeepEP training step: dispatch/combine 98 ms of kernel time in a 112 ms step).
_DEEP_EP = r"(\b|_)ep::(intra|inter)node(_ll)?::"  # DeepEP's expert-parallel dispatch/combine (deep_ep::internode::combine)
_CUSTOM_ALL_REDUCE = r"cross_device_reduce"  # vLLM's and SGLang's
_COMM_KERNEL = re.compile(
    rf"^(nccl|rccl|oneccl_)|{_DEEP_EP}|{_CUSTOM_ALL_REDUCE}"  # oneCCL's kernels: oneccl_reduce_base<float, ...>
    r"|\bmultimem_|\b(one|two)_shot_all_reduce|symmetric_memory::"  # torch's symmetric-memory collectives
    r"|userbuffers|nvshmem|mscclpp",  # Transformer Engine's comm/GEMM overlap, NVSHMEM, MSCCL++
    re.IGNORECASE,
)
_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# torch.cuda.graph's own set-up and tear-down around a capture (a sync, gc.collect, empty_cache), when stacks are recorded.
_CAPTURE_FRAMES = re.compile(r"^torch/cuda/graphs\.py\(\d+\): __(enter|exit)__$")


def is_sync(span: Span) -> bool:
    """A call that blocks the host until the device catches up."""
    return span.name in _SYNC_NAMES


def is_comm(span: Span) -> bool:
    """A host-side collective call or its worker span (FSDP2's collective regions included)."""
    return span.name.startswith(_COMM_PREFIXES) or span.name == "record_param_comms"


def is_functional(name: str) -> bool:
    """A functional collective or its wait (``_c10d_functional::all_reduce``, ``wait_tensor``): DTensor's (tensor
    parallelism) and torch.compile'd graphs', not a loop's ``dist.all_reduce``."""
    return name.startswith(FUNCTIONAL_COLLECTIVE_PREFIXES)


def is_copy_call(span: Span) -> bool:
    """A host-side runtime call that starts a copy (``cudaMemcpyAsync``, ``hipMemcpyWithStream``...)."""
    return starts_copy(span.cat, span.name)


def is_data(span: Span) -> bool:
    """A DataLoader ``__next__`` span."""
    return span.name.startswith("enumerate(DataLoader)#") or (span.cat == "python_function" and "_next_data" in span.name)


def is_optimizer(span: Span) -> bool:
    """``Optimizer.step`` / ``zero_grad``, as the optimizer's profiling hook names them."""
    return span.name.startswith((OPTIMIZER_STEP, "Optimizer.zero_grad#"))


def is_backward(span: Span) -> bool:
    """An autograd node (``autograd::engine::evaluate_function: ...``, a leaf's ``AccumulateGrad`` too: DDP's reducer
    launches and, on a CPU, waits for its last bucket's all-reduce in one) or a ``record_function`` that names
    backward, on any host thread; or a compiled autograd graph (``Torch-Compiled Region: !0/...``: compiled
    autograd's compile ids start with ``!``)."""
    return span.cat in ("cpu_op", "user_annotation") and not is_comm(span) and not _forward_function(span.name) and (
        _BACKWARD.search(span.name) is not None or span.name.startswith(_COMPILED_AUTOGRAD)
    )


def _forward_function(name: str) -> bool:
    """An autograd Function's forward, named by its class (FSDP2's ``RegisterPostBackwardFunction``, applied in the
    module's forward so that its backward node runs the post-backward hook): no backward, whatever the class says."""
    return name.endswith("Function") and ":" not in name


# DDP's forward marks itself (torch.nn.parallel.DistributedDataParallel.forward, every release): its job's gradients
# are all-reduced in buckets during backward already.
DDP_FORWARD = ("DistributedDataParallel.forward", "user_annotation")
# Ops that read a device value back by their nature: those that size their output from the data (boolean-mask
# indexing x[mask] runs aten::index, nonzero, unique, repeat_interleave without output_size, one_hot without
# num_classes) and those that turn a tensor into a Python bool (if t:, torch.equal). A read inside one is named by it.
SIZED_BY_DATA = frozenset({
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::index", "aten::index_put_",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::repeat_interleave", "aten::bincount", "aten::one_hot",
})
TENSOR_CONDITIONS = frozenset({"aten::is_nonzero", "aten::equal", "aten::allclose"})
READING_OPS = SIZED_BY_DATA | TENSOR_CONDITIONS
# torch.amp.GradScaler.update's op: the job scales its loss (fp16 autocast), and unless its optimizer is fused the
# scaler reads found_inf back every step to decide whether to skip the optimizer step.
GRAD_SCALER_UPDATE = ("aten::_amp_update_scale_", "cpu_op")


def is_forward(span: Span) -> bool:
    """A module's forward: ``*.forward`` annotations, ``nn.Module:`` spans, or ``## forward ##``."""
    if span.name.startswith("nn.Module:"):
        return True
    return span.cat == "user_annotation" and (span.name.endswith(".forward") or span.name.strip("# ") == "forward")


def is_runtime(span: Span) -> bool:
    """A device runtime or driver call (``cudaMalloc``, ``cudaLaunchKernel``, ``hipEventRecord``, MTIA's, an Intel
    GPU's ``urEnqueueKernelLaunch``...)."""
    return span.cat in RUNTIME_CATEGORIES


def is_region(span: Span) -> bool:
    """A named stretch of host work a fix can point at: an optimizer step or zero_grad, or a ``record_function``
    region of the user's (not a step, phase, DataLoader or collective marker)."""
    if is_optimizer(span):
        return True
    return (
        span.cat == "user_annotation"
        and not span.name.startswith(("ProfilerStep#", "## "))
        and not (is_forward(span) or is_backward(span) or is_data(span) or is_comm(span))
    )


def is_compiled_name(text: str) -> bool:
    """Whether ``text`` names a torch.compile'd graph's host span (AOTAutograd's ``CompiledFunction`` and its
    backward, Dynamo's ``Torch-Compiled Region: 0/0`` and cache lookup)."""
    return any(mark in text for mark in _COMPILED_HOST)


def is_marker_name(name: str) -> bool:
    """A span that marks a phase or a step, not an op: host time innermost in it is Python in that phase, no op to fix.
    Inductor's ``## Call CompiledFxGraph <hash> ##`` is no marker: time in it is the compiled graph's own host time."""
    marks = name.startswith(("Optimizer.", "## ", "nn.Module:", "ProfilerStep#")) or name.endswith(".forward")
    return marks and not is_compiled_name(name)


def regions_within(groups: Kinds, windows: Sequence[tuple[float, float]]) -> tuple[list[Span], frozenset[str]]:
    """The regions of one thread's spans (``groups``, :func:`is_region`), sorted, less those around the step's work,
    and those names: a region that encloses a whole window (vLLM's ``execute_context...``, a ``record_function``
    around the loop), or a user's region that holds a module's forward (xDiT's ``execute_diffusion_...``: 99.97% of
    its step, every forward pass inside), is no part of the step a fix can point at; time innermost in it is Python
    in the step, or the model's. Not a region covering most of a step alone: the profiler tutorial's ``MASK
    INDICES`` covers 98.6-99.1% of its steps, holds no forward, and is the cause to name (its round trip through the
    host). An optimizer step that runs a closure's forward stays the optimizer's."""
    regions = sorted((s for spans in groups.values() if is_region(spans[0]) for s in spans), key=lambda s: (s.ts, -s.end))
    forwards = sorted(s.ts for spans in groups.values() if is_forward(spans[0]) for s in spans)

    def holds_forward(region: Span) -> bool:
        i = bisect.bisect_left(forwards, region.ts)
        return i < len(forwards) and forwards[i] < region.end and not is_optimizer(region)

    around = frozenset(
        s.name for s in regions if holds_forward(s) or any(s.ts <= t0 and s.end >= t1 for t0, t1 in windows)
    )
    return [s for s in regions if s.name not in around], around


def graph_captures(groups: Kinds) -> Intervals:
    """When one thread's spans (``groups``) record CUDA/HIP graphs: each ``cudaStreamBeginCapture`` to the next
    ``cudaStreamEndCapture`` (to the thread's last span when it never ends), the graph's instantiation,
    torch.cuda.graph's set-up and tear-down, and Inductor's ``CUDAGraphNode.record`` (CUDA graph trees). Kernels
    launched in a capture run only when the graph is replayed, so the device idles meanwhile by design."""
    begins: list[float] = []
    ends: list[float] = []
    out: list[tuple[float, float]] = []
    for (name, cat), spans in groups.items():
        runtime = cat in RUNTIME_CATEGORIES
        if runtime and "StreamBeginCapture" in name:
            begins += (s.ts for s in spans)
        elif runtime and "StreamEndCapture" in name:
            ends += (s.end for s in spans)
        elif (runtime and "GraphInstantiate" in name) or name.startswith("CUDAGraphNode.record") or (
            cat == "python_function" and _CAPTURE_FRAMES.match(name)
        ):
            out += ((s.ts, s.end) for s in spans)
    ends.sort()
    for begin in begins:
        i = bisect.bisect_right(ends, begin)
        end = ends[i] if i < len(ends) else max(s.end for spans in groups.values() for s in spans)
        out.append((begin, end))
    return union(out)


def compilations(groups: Kinds) -> Intervals:
    """When one thread's spans (``groups``) run torch.compile's compiler: Dynamo's ``dynamo_timed`` regions
    (``_compile.compile_inner (dynamo_timed)``, Inductor's code generation, the backward's lazy compile, Triton's
    autotuning at a kernel's first run), which every PyTorch since 2.1 records as ``<phase> (dynamo_timed)``."""
    return union((s.ts, s.end) for (name, _), spans in groups.items() if name.endswith(" (dynamo_timed)") for s in spans)


def is_comm_kernel(span: Span) -> bool:
    """A collective's device kernel (NCCL / RCCL)."""
    return span.cat == "kernel" and is_comm_kernel_name(span.name)


# Asked once per device span (idle.py), of a few hundred distinct names up to kilobytes long (C++ templates), where the
# unanchored search costs ~50 µs: the answer per name is kept (searched every time, it tripled a rank's analysis time).
@functools.lru_cache(maxsize=8192)
def is_comm_kernel_name(name: str) -> bool:
    """A kernel name that is a collective's: it runs beside compute and waits for peers, no kernel to tune."""
    return _COMM_KERNEL.search(name) is not None


# What a collective kernel runs, from the name PyTorch 2.2+ writes on it ("Collective name": allreduce, _allgather_base,
# all_to_allv, send), else the host collective its launch ran inside, else its own name (ncclKernel_AllReduce_RING_LL,
# DeepEP's internode::combine). First match wins: NCCL runs an all-to-all as sends and receives, so the written name
# is asked before the kernel's.
_COLLECTIVES: tuple[tuple[CollectiveKind, re.Pattern[str]], ...] = (
    ("all_to_all", re.compile(rf"all_?to_?all|{_DEEP_EP}", re.IGNORECASE)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
    ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("all_reduce", re.compile(rf"all_?reduce|{_CUSTOM_ALL_REDUCE}", re.IGNORECASE)),
    ("send_recv", re.compile(r"send|recv", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
)
# NCCL's generic kernels run whatever collective their work says: 2.12-2.18 launch ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t
# (its ncclKernelGeneric) for every collective on the SIMPLE protocol, 2.19+ ncclDevKernel_Generic. Their names say
# nothing: HTA's TorchRec traces launch that "SendRecv" kernel from c10d::allreduce_ and c10d::_allgather_base_ too.
_GENERIC_KERNEL = re.compile(r"ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t\b|ncclDevKernel_Generic\b")


def collective_kind(span: Span, launched_by: CollectiveKind = "other") -> CollectiveKind:
    """Which collective a collective kernel runs: the name written on it, else ``launched_by`` (the host collective
    its launch ran inside), else its own name unless that is NCCL's generic kernel ("other" where none says)."""
    written = span.args.get("collective") if span.args else None
    if isinstance(written, str) and (kind := collective_of(written)) != "other":
        return kind
    if launched_by != "other" or _GENERIC_KERNEL.search(span.name):
        return launched_by
    return collective_of(span.name)


@functools.lru_cache(maxsize=4096)  # asked of every collective call and kernel, of a few dozen distinct names
def collective_of(name: str) -> CollectiveKind:
    """Which collective a kernel or host op (``nccl:all_to_all``, ``FSDP::all_gather``) of this name runs."""
    for kind, pattern in _COLLECTIVES:
        if pattern.search(name):
            return kind
    return "other"


def is_compute_kernel(span: Span) -> bool:
    """Device work that computes: not a collective, copy, memset, DMA or sync (HTA's COMPUTATION)."""
    return (
        span.cat in ("kernel", "mtia_ccp_events")
        and _MEMORY_KERNEL.match(span.name) is None
        and _NOT_COMPUTE.match(span.name) is None
        and not is_comm_kernel_name(span.name)
    )


def by_kind(spans: Iterable[Span]) -> Kinds:
    """``spans`` grouped by (name, category), each group in the order given."""
    groups: Kinds = defaultdict(list)
    for s in spans:
        groups[(s.name, s.cat)].append(s)
    return groups


def is_device_work(span: Span) -> bool:
    """A span of work on the device: a kernel, copy or memset, not a stream waiting."""
    return span.cat in _DEVICE_CATEGORIES and not (span.cat == "mtia_ccp_events" and span.name in _MTIA_STREAM_SYNC)


def where(groups: Kinds, rule: Callable[[Span], bool]) -> Iterator[tuple[float, float]]:
    """``(start, end)`` of the grouped spans ``rule`` holds for (asked of each group's first span)."""
    return ((s.ts, s.end) for spans in groups.values() if rule(spans[0]) for s in spans)


# A sync or copy is named by its site, "region / op": the innermost record_function region (or optimizer step)
# around it, and the op; without a region, the op alone. Region names may hold " / "; op names do not.
def site(region: str | None, op: str | None) -> str:
    """``region / op``, or whichever of them there is ('' for neither)."""
    return " / ".join(name for name in (region, op) if name)


def site_parts(name: str) -> tuple[str | None, str]:
    """A :func:`site`'s region (None without one) and op."""
    region, _, op = name.rpartition(" / ")
    return region or None, op
