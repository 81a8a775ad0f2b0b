"""The change that lets exposed collectives overlap compute, chosen by which collective leads the rank's
communication: DDP's bucketing moves an all-reduce, not a MoE's all-to-all or a pipeline's sends, and FSDP's
prefetching is the lever for all-gathers.

A job that runs DDP already (its forward marks itself) is told DDP's own settings, or, where its collectives outlast
the compute that could hide them, to send fewer bytes per sample. A DeepSpeed engine's own all-reduce after backward
is told its config's keys for the ZeRO stage its frames show (:mod:`orchestrator.analysis.zero_stage`), not DDP's.
The collectives an optimizer's step makes itself (ZeroRedundancyOptimizer's broadcast of its shards) are told as its
own, and all-reduces made through functional collectives without DDP as tensor parallelism's, which no bucket moves.
The job's own, where they hold most of the wait, are told by who makes them: Lightning's ``sync_dist``, torchmetrics'
state sync (``dist_sync_on_step=True``), a loop's own values.

The lead is the collective whose kernels no compute overlaps the longest (:attr:`GpuStats.comm_exposed_by_collective`):
a large all-reduce that backward hides needs no change, a small exposed all-gather does. On a rank without a device
it is read from its host collectives' names (``gloo:all_reduce``, ``c10d::alltoall_base_``), which block the step.
"""

from __future__ import annotations

from orchestrator.analysis.deepspeed_fix import deepspeed_reduces, deepspeed_reduction
from orchestrator.analysis.kernel_kinds import kernel_kind
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.metric_sync import metric_sync
from orchestrator.analysis.python_frames import frame_label
from orchestrator.analysis.spans import collective_of, is_functional
from orchestrator.loops import Loop
from orchestrator.models.analysis import COLLECTIVE_LABELS, CollectiveKind, OpStat, RankSummary

__all__ = ["by_collective_text", "comm_fix", "fsdp_fix", "own_fix", "surely_own"]

_ALL_REDUCE = (
    "Let gradient communication run during backward: use DDP/FSDP rather than an all_reduce after backward, "
    "tune DDP bucket_cap_mb so the first buckets start early, accumulate gradients under no_sync() across "
    "micro-batches, or compress gradients (DDP comm hooks, bf16)."
)
_DDP_BOUND = (
    "DDP already all-reduces the gradients in buckets during backward, but its collectives take {comm:.1f} ms a step "
    "and the {compute} that could hide them {work:.1f} ms: no bucket size hides that. Send fewer bytes per sample: "
    "accumulate gradients under no_sync() over micro-batches (one all-reduce per N of them), a larger batch per rank, "
    "or compress the gradients (model.register_comm_hook: bf16_compress_hook where they are fp32, or PowerSGD)."
)
_DDP_TAIL = (
    "DDP already all-reduces the gradients in buckets during backward; {exposed:.1f} ms a step of it stays exposed "
    "(the buckets that fill as backward ends): a smaller bucket_cap_mb (default 25) starts each bucket sooner, "
    "gradient_as_bucket_view=True saves the copy into buckets, static_graph=True spares a fixed model DDP's search for "
    "unused parameters each step, and no_sync() over micro-batches all-reduces once per N of them."
)
_EXPERTS = (
    "The all-to-all moves tokens to their experts and back (expert parallelism), and gradient bucketing does not "
    "touch it: split each batch into two micro-batches and run one's dispatch and combine while the other computes "
    "(DualPipe, two-batch overlap); keep the expert-parallel group inside one node (NVLink) where the experts fit; "
    "balance the routing (a load-balancing loss, a capacity factor) so no rank receives more tokens than the rest."
)
_NCCL_EXPERTS = " NCCL runs it here as sends and receives: DeepEP's dispatch and combine kernels are built for this exchange."
_EMBEDDINGS = (
    "The {label} exchanges sharded embeddings (FBGEMM's tables, TorchRec{how}), and gradient bucketing does not touch "
    "it: TorchRec's TrainPipelineSparseDist runs the next batch's input and embedding all-to-alls during this batch's "
    "compute; table-row-wise sharding moves less of the exchange across nodes; quantized communication "
    "(TorchRec's QCommsConfig, fp16 or bf16) halves the bytes."
)
_SEND_RECV = (
    "Point-to-point sends and receives are pipeline stages waiting for their neighbours (or an all-to-all the trace "
    "does not name): more micro-batches per batch shrink the pipeline's bubble, an interleaved or zero-bubble schedule "
    "(torch.distributed.pipelining's ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble) hides most of the rest, "
    "and stages of equal cost keep neighbours from waiting on the slowest."
)
_GATHER = (
    "Parameters are gathered and gradients reduce-scattered (FSDP, ZeRO-3): prefetch each unit's all-gather during the "
    "previous unit's compute (FSDP's forward_prefetch and backward_prefetch, FSDP2's set_modules_to_forward_prefetch), "
    "wrap units large enough that each collective runs near the link's bandwidth, and shard within a node while "
    "replicating across nodes (HSDP) when the inter-node link is the limit."
)

_BROADCAST = (
    "The broadcast is most often DDP copying module buffers (BatchNorm's running statistics) from rank 0 before every "
    "forward (broadcast_buffers=True, its default): pass DDP(..., broadcast_buffers=False) where each rank may keep its "
    "own buffers (sync them once before evaluating or saving); a broadcast of the job's own (a value from rank 0 every "
    "step) is better sent once, or computed on every rank."
)
_TENSOR_PARALLEL = (
    "The all-reduces are tensor parallelism's (DTensor's functional collectives: a RowwiseParallel layer's output in "
    "forward, a ColwiseParallel layer's input gradient in backward): each layer waits for its own, and no DDP or FSDP "
    "setting moves them. "
)
_TENSOR_PARALLEL_DEVICE = (
    "Keep the tensor-parallel group inside one node (NVLink); SequenceParallel for the norms turns each all-reduce into "
    "an all-gather and a reduce-scatter that torch.compile's async tensor parallelism overlaps with the matmuls "
    "(torch._inductor.config._micro_pipeline_tp = True, symmetric memory enabled for the group); and a smaller "
    "tensor-parallel degree, with FSDP or DDP across the other ranks, sends fewer of them."
)
_TENSOR_PARALLEL_CPU = (
    "On a CPU (gloo) nothing overlaps them, and each is a round trip its layer waits for whatever its size: more rows "
    "per step (a larger batch, longer sequences) spread each over more compute; data parallelism instead (DDP) "
    "exchanges every gradient each step, cheaper only where the gradients are small beside the activations."
)
_ZERO_REDUNDANCY = (
    "ZeroRedundancyOptimizer broadcasts each rank's updated shard of the parameters once its step is done, after "
    "backward, where no compute hides it: {calls}. "
)
_ZERO_OVERLAP = (
    "Construct it with overlap_with_ddp=True and register DDP's comm hook hook_with_zero_step(allreduce_hook, "
    "ddp_model, zero) (torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook), so that each bucket's step and "
    "broadcast run during backward (NCCL: gloo refuses it). "
)
_ZERO_LESS = (
    "With parameters_as_bucket_view=True each rank's shard goes as one broadcast where each parameter goes on its own; "
    "where the optimizer's state fits on every rank, a plain optimizer broadcasts nothing."
)


def collective_ms(r: RankSummary) -> dict[CollectiveKind, float]:
    """The rank's exposed collective time per step by collective, largest first: its collective kernels' that no
    compute overlaps, or with no device its host collectives' (summed over the analysed steps)."""
    if r.gpu is not None and (r.gpu.comm_exposed_by_collective or r.gpu.comm_by_collective):
        return r.gpu.comm_exposed_by_collective or r.gpu.comm_by_collective  # a summary from before the exposed split
    n = max(len(r.steps), 1)
    out: dict[CollectiveKind, float] = {}
    for op in r.comm_ops:
        kind = collective_of(op.name)
        out[kind] = out.get(kind, 0.0) + op.total_ms / n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def leading_collective(r: RankSummary) -> CollectiveKind | None:
    """The collective that holds most of the rank's communication, of those the trace names (None: none)."""
    # Kernels the trace does not name (NCCL's generic kernel launched without PyTorch's record) say nothing either way.
    return next((k for k in collective_ms(r) if k != "other"), None)


def by_collective_text(r: RankSummary) -> str:
    """One sentence of the collectives' time by kind, when the rank's device collectives are named."""
    if r.gpu is None or not r.gpu.comm_by_collective:
        return ""
    exposed = r.gpu.comm_exposed_by_collective
    parts = ", ".join(
        f"{COLLECTIVE_LABELS[k]} {ms:.1f} ms" + (f" ({exposed[k]:.1f} exposed)" if k in exposed else "")
        for k, ms in r.gpu.comm_by_collective.items() if ms >= 0.05
    )
    return f" Collective kernel time per step by collective: {parts}." if parts else ""


def _embeddings(r: RankSummary) -> bool:
    """The rank looks up sharded embedding tables (FBGEMM's ops or kernels): its all-to-all is theirs, not experts'."""
    return any(op.name.startswith("fbgemm::") for op in r.top_ops) or any(kernel_kind(k.name) == "embedding" for k in r.top_kernels)


def _on_nccl(r: RankSummary) -> bool:
    """The rank's all-to-all runs on NCCL's (RCCL's) kernels: one is among its top kernels and no library's own
    all-to-all kernel (DeepEP's dispatch / combine) is."""
    nccl = [k.name.lower().startswith(("nccl", "rccl")) for k in r.top_kernels]
    own = any(not lib and collective_of(k.name) == "all_to_all" for k, lib in zip(r.top_kernels, nccl))
    return any(nccl) and not own


def comm_fix(r: RankSummary) -> str:
    """The fix for the collective that leads the rank's communication (FSDP2's own, when its regions hold it; the
    job's own calls outside forward and backward, when their waits hold most of it)."""
    if (own := _own_fix(r)) is not None:
        return own
    if (fsdp := fsdp_fix(r)) is not None:
        return fsdp
    if (optimizer := _optimizer_fix(r)) is not None:
        return optimizer
    lead = leading_collective(r) or "all_reduce"
    if lead == "all_reduce" and _tensor_parallel(r):
        return _TENSOR_PARALLEL + (_TENSOR_PARALLEL_CPU if r.device == "cpu" else _TENSOR_PARALLEL_DEVICE)
    if lead in ("all_to_all", "all_gather", "reduce_scatter") and _embeddings(r):  # not a MoE's, not FSDP's
        how = "" if lead == "all_to_all" else "; row-wise sharding reduce-scatters pooled embeddings forward and all-gathers their gradients backward"
        return _EMBEDDINGS.format(label=COLLECTIVE_LABELS[lead], how=how)
    if lead == "all_to_all":
        return _EXPERTS + (_NCCL_EXPERTS if _on_nccl(r) else "")
    if lead == "send_recv":
        return _SEND_RECV
    if lead in ("all_gather", "reduce_scatter"):
        return _GATHER + in_loop(r.loop, [Change.PREFETCH_PARAMETERS])
    if lead == "broadcast":
        return _BROADCAST
    return (_ddp(r) if r.ddp else _ALL_REDUCE) + in_loop(r.loop, _ddp_changes(r))


def _tensor_parallel(r: RankSummary) -> bool:
    """The rank all-reduces through functional collectives without DDP, and they hold most of its collective calls'
    time: DTensor's tensor parallelism (a compiled DDP model's, issued in backward, marks DDP's forward; FSDP2's
    clip_grad_norm_ all-reduces the norm so, once a step beside its own regions)."""
    functional = sum(op.total_ms for op in r.comm_ops if is_functional(op.name))
    return (
        not r.ddp
        and 2 * functional >= sum(op.total_ms for op in r.comm_ops)
        and any(is_functional(op.name) and collective_of(op.name) == "all_reduce" for op in r.comm_ops)
    )


def _optimizer_fix(r: RankSummary) -> str | None:
    """The fix for the collectives the optimizer's step makes itself, when they hold at least a third of the rank's
    collective wait (a DeepSpeed engine's are told as its ZeRO stage makes them): no gradient bucketing moves them.
    Where the rest holds a third too (ZeroRedundancyOptimizer under DDP: the gradients' all-reduce), its fix follows."""
    made = r.optimizer_comm
    if made is None or 3 * made.total_ms < r.comm_wait_ms or made.total_ms <= 0 or deepspeed_reduces(r):
        return None
    text = _optimizer_text(r, made)
    rest = r.comm_wait_ms - made.total_ms
    if 3 * rest < r.comm_wait_ms:
        return text
    return f"{text} The other {rest:.1f} ms: " + comm_fix(r.model_copy(update={"optimizer_comm": None, "comm_wait_ms": rest}))


def _optimizer_text(r: RankSummary, made: OpStat) -> str:
    """What the optimizer's own collectives (``made``) cost and the change that moves them, by its class."""
    per_step = made.calls / max(len(r.steps), 1)
    calls = (
        f"{per_step:.0f} collective call{'' if round(per_step) == 1 else 's'} a step ({made.name}) hold {made.total_ms:.1f} ms "
        f"of the {r.comm_wait_ms:.1f} ms the step waits in collectives"
    )
    if "ZeroRedundancyOptimizer" in r.optimizers:
        return _ZERO_REDUNDANCY.format(calls=calls) + ("" if r.device == "cpu" else _ZERO_OVERLAP) + _ZERO_LESS
    stepped = " and ".join(f"{name}.step" for name in r.optimizers) or "the optimizer's step"
    return (
        f"{stepped} makes collectives of its own after backward, where no compute hides them: {calls}. They exchange "
        "its parameters or state (a sharded or distributed optimizer's), not the gradients' reduction, so no DDP "
        "setting moves them: its own options for overlapping them with backward do, or, where its state fits on every "
        "rank, an unsharded optimizer, which makes none."
    )


def _own_fix(r: RankSummary) -> str | None:
    """:func:`own_fix`, when the job's own collectives hold at least half of the rank's collective wait."""
    own = r.own_comm
    if own is None or 2 * own.total_ms < r.comm_wait_ms or own.total_ms <= 0:
        return None
    return own_fix(r)


def own_fix(r: RankSummary) -> str | None:
    """The fix for the job's own collectives (:attr:`RankSummary.own_comm`; None without): each is a round trip across
    every rank that the step waits for, and no DDP or FSDP setting moves it."""
    own = r.own_comm
    if own is None:
        return None
    per_step = own.calls / max(len(r.steps), 1)
    one = round(per_step) == 1
    if all(name.endswith("barrier") for name in own.name.split(" + ")):
        return (
            f"{per_step:.0f} barrier{'' if one else 's'} a step ({own.name}{_made_in(r)}) outside forward and backward "
            f"hold{'s' if one else ''} {own.total_ms:.1f} ms of the {r.comm_wait_ms:.1f} ms the step waits in collectives: a barrier moves no "
            "data and only makes every rank wait for the slowest; the gradients' all-reduce lines the ranks up each step "
            "already: drop it from the loop (keep one before saving a checkpoint or timing a phase, if any)."
        )
    calls = (
        f"{per_step:.0f} collective call{'' if one else 's'} a step ({own.name}{_made_in(r)}) run{'s' if one else ''} outside forward "
        f"and backward and hold{'s' if one else ''} {own.total_ms:.1f} ms of the {r.comm_wait_ms:.1f} ms the step waits in collectives"
    )
    if metrics := metric_sync(r):
        return f"{calls}: {metrics}"
    if _logged_syncs(own.name):
        # A barrier, then an all-reduce: Lightning's sync of each value self.log(..., sync_dist=True) logs on the step,
        # inside training_step (DDP's forward holds it).
        pairs = per_step / 2
        return (
            f"{pairs:.0f} barrier{'' if round(pairs) == 1 else 's'} a step, each followed by an all-reduce ({own.name}{_made_in(r)}), hold "
            f"{own.total_ms:.1f} ms of the {r.comm_wait_ms:.1f} ms the step waits in collectives: a value reduced across the "
            "ranks every step, two round trips that every rank waits for. "
            + (
                "Lightning's self.log(..., sync_dist=True) runs both for each value it logs on the step: log per-step "
                "values without sync_dist (each rank's own; the logger writes rank 0's), or with on_step=False, "
                "on_epoch=True, reduced once at the epoch's end."
                if r.loop is Loop.LIGHTNING
                else "Reduce the values together (torch.stack them, one all_reduce, no barrier), every N steps rather "
                "than every step."
            )
        )
    if deepspeed_reduces(r):  # not the job's own values: the engine's reduction, as its ZeRO stage does it
        return f"{calls}: DeepSpeed's engine makes them itself once backward is done, {deepspeed_reduction(r)}"
    lead = (
        "DDP reduces the gradients during backward already, so these are the job's own values"
        if _reduces_in_backward(r)
        else "if they average the gradients, DDP or FSDP reduces them in buckets during backward instead; if they are "
        "the job's own values"
    )
    return (
        f"{calls}: {lead} (a metric, the loss reduced for logging), each a round trip across the ranks: reduce them together (torch.stack "
        "the values, one all_reduce), every N steps rather than every step, or with async_op=True, waiting only when "
        "the value is logged."
    )


def _made_in(r: RankSummary) -> str:
    """', made in f (file:line)': the frame of the user's or a library's code around more than half of the waits in the
    job's own collectives (a with_stack trace's, else the agent's stack samples'); '' without one."""
    top = max(r.own_comm_callers, key=lambda c: c.total_ms, default=None)
    if top is None or 2 * top.total_ms <= sum(c.total_ms for c in r.own_comm_callers):
        return ""
    return f", made in {frame_label(top.name, 90)}"


def surely_own(r: RankSummary) -> bool:
    """Whether the job's own collectives of ``r`` cannot be its gradients' reduction: DDP or FSDP reduces those during
    backward, or they are a logged value's barrier and all-reduce. Without either (a DeepSpeed engine reducing after
    backward, a hand-written loop) an all-reduce after backward may be the gradients'."""
    own = r.own_comm
    if own is None or deepspeed_reduces(r):
        return False
    return _reduces_in_backward(r) or _logged_syncs(own.name)


def _reduces_in_backward(r: RankSummary) -> bool:
    return r.ddp or any(op.name.startswith("FSDP::") for op in r.comm_ops)


def _logged_syncs(names: str) -> bool:
    """The job's own collectives are barriers and all-reduces (:func:`orchestrator.analysis.collectives.own_comm` takes
    an all-reduce inside the model's time only after a barrier)."""
    parts = set(names.split(" + "))
    return any(p.endswith("barrier") for p in parts) and any(collective_of(p) == "all_reduce" for p in parts)


def _ddp_changes(r: RankSummary) -> list[Change]:
    """The settings a framework's loop makes :func:`_ddp`'s (or the plain all-reduce's) changes with."""
    if not r.ddp:
        return [Change.GRADIENT_BUCKETS, Change.ACCUMULATE, Change.COMPRESS_GRADIENTS]
    if _ddp_bound(r):
        return [Change.ACCUMULATE, Change.COMPRESS_GRADIENTS]
    return [Change.GRADIENT_BUCKETS, Change.ACCUMULATE]


def _ddp_figures(r: RankSummary) -> tuple[float, float, str, float]:
    """DDP's collective time, the compute that could hide it (and its name), and the exposed part, per step."""
    if r.gpu is not None:
        comm = r.gpu.comm_kernel_ms_per_step
        return comm, r.gpu.kernel_ms_per_step - comm, "compute kernels", r.gpu.comm_exposed_ms_per_step
    return r.comm_wait_ms, r.mean_phases.backward, "backward", r.comm_wait_ms


def _ddp_bound(r: RankSummary) -> bool:
    """The collectives outlast the compute that could hide them: no bucket size helps."""
    comm, work, _, _ = _ddp_figures(r)
    return comm >= work


def _ddp(r: RankSummary) -> str:
    """DDP's changes: its all-reduce overlaps backward already, so by whether the compute could hide it at all (device
    collective kernels against compute kernels; on a CPU, the exposed wait against backward's host time)."""
    comm, work, compute, exposed = _ddp_figures(r)
    if _ddp_bound(r):
        return _DDP_BOUND.format(comm=comm, compute=compute, work=work)
    return _DDP_TAIL.format(exposed=exposed)


def fsdp_fix(r: RankSummary) -> str | None:
    """FSDP2's own changes, when its collective regions hold most of the rank's collective host time (else None):
    DDP's bucket advice does not apply to a job whose parameters are gathered, not all-reduced.

    Chosen by what the trace shows: how many all-gathers a step makes (one per unit in forward: one in all means
    the model is one unit), how many gather a unit again for backward (``regathers_per_step``), and the device (on
    a CPU, gloo's collectives block the step, so FSDP2's overlap cannot help there, and fewer, larger units cost less).
    """
    total_ms = sum(op.total_ms for op in r.comm_ops)
    fsdp = [op for op in r.comm_ops if op.name.startswith("FSDP::")]
    if not fsdp or 2 * sum(op.total_ms for op in fsdp) < total_ms:
        return None
    n = max(len(r.steps), 1)
    gathers = sum(op.calls for op in fsdp if op.name == "FSDP::all_gather") / n
    gather = sum(op.total_ms for op in fsdp if op.name.startswith("FSDP::all_gather")) / n
    reduce = sum(op.total_ms for op in fsdp if not op.name.startswith("FSDP::all_gather")) / n
    changes = []
    if r.device == "cpu":
        if gathers > 1:
            changes.append(f"shard fewer, larger layer groups: on a CPU each of the step's {gathers:.0f} all-gathers and its "
                           "reduce-scatters blocks the step (gloo), so fewer collectives cost less")
    elif gathers <= 1:
        changes.append("the model is gathered as one unit, so nothing overlaps its all-gather: call fully_shard on each "
                       "transformer block or layer group before the root, so each block's all-gather overlaps the previous one's compute")
    else:
        changes.append("prefetch further ahead so each all-gather overlaps more compute (set_modules_to_forward_prefetch / "
                       "set_modules_to_backward_prefetch)")
    if r.regathers_per_step >= 1:
        changes.append(f"reshard_after_forward=False where memory allows skips the {r.regathers_per_step:.0f} all-gathers per "
                       "step that gather parameters again for backward")
    changes.append("when accumulating gradients, skip their sync on all but the last micro-batch (set_requires_gradient_sync(False))")
    changes.append("if the model fits on one device, DDP " + (
        "moves about two thirds of the bytes (no second all-gather)" if r.regathers_per_step >= 1
        else "sends the same bytes as bucketed all-reduces that overlap backward"))
    return (
        f"FSDP's collectives do not overlap compute (on rank {r.rank}, per step: all-gather {gather:.1f} ms, "
        f"reduce-scatter {reduce:.1f} ms of host time): " + "; ".join(changes) + "."
    )
