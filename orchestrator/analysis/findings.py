"""Recommendations: plain-language findings tied to evidence, ranked by what they can win.

Each rule reads the per-rank and cross-rank results and either returns one
``Finding`` (what, evidence with numbers and ranks, a concrete fix) or nothing.
A job under every threshold below gets no findings at all, never generic advice.

Every finding states the step time its fix could save *at most*
(``max_saving_ms``), and findings are ranked by it. The bound is what the
evidence allows: a host-side fix (data loading, a sync, a blocking copy)
shortens the host's path by at most the time it takes, and the step can never
get shorter than the device's busy time, so on a GPU it saves at most the
device's idle time too. That is why a GPU-bound job gets its kernels named
and only quiet notes about syncs whose removal would barely move the step.
A finding is a warning when that bound reaches ``WARNING_SAVING_FRACTION`` of the step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from orchestrator.analysis.models import CopyStats, Finding, RankSummary, Straggler

__all__ = [
    "COMM_EXPOSED_FRACTION",
    "DATALOADER_BOUND_FRACTION",
    "GPU_BOUND_UTILIZATION",
    "HOST_SYNC_FRACTION",
    "LOW_GPU_UTILIZATION",
    "MEMCPY_FRACTION",
    "MEMORY_PEAK_FRACTION",
    "MIN_SYNC_SAVING_FRACTION",
    "RULES",
    "WARNING_SAVING_FRACTION",
    "find_all",
]

# Share of the step spent waiting for the next batch.
DATALOADER_BOUND_FRACTION = 0.25
# Share of the step a per-step sync's removal could save before it is a warning
# (below it, a sync in every step is still reported, as info).
HOST_SYNC_FRACTION = 0.05
# Share of the step the host spends blocked in host-to-device copies.
MEMCPY_FRACTION = 0.05
# Busy share of the step on the GPU under which it is called underused.
LOW_GPU_UTILIZATION = 0.5
# Busy share of the step from which the job is GPU-bound: only faster kernels help.
GPU_BOUND_UTILIZATION = 0.9
# How many kernels the GPU-bound finding names.
GPU_BOUND_TOP_KERNELS = 5
# Share of the step that even the least-waiting rank waits in collectives.
COMM_EXPOSED_FRACTION = 0.25
# Share of a device's memory that the peak allocation reaches.
MEMORY_PEAK_FRACTION = 0.9
# Share of the step a fix must be able to save for its finding to be a warning.
WARNING_SAVING_FRACTION = 0.05
# On a device, a per-step sync whose removal could save less than this share of the step is not reported.
MIN_SYNC_SAVING_FRACTION = 0.01
_COMM_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
_DEVICE_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "mtia": "MTIA", "cpu": "CPU"}


def _ranks(ranks: Sequence[RankSummary]) -> str:
    ids = [r.rank for r in ranks]
    return f"rank {ids[0]}" if len(ids) == 1 else "ranks " + ", ".join(map(str, ids))


def _share(r: RankSummary, ms: float) -> float:
    return ms / r.mean_step_ms if r.mean_step_ms else 0.0


def _step_word(r: RankSummary) -> str:
    return "trace (no ProfilerStep)" if r.window == "whole_trace" else "step"


def _host_fix_bound(r: RankSummary, ms: float) -> float:
    """At most the host time removed, and on a device at most its idle time: the step cannot beat the device."""
    return min(ms, r.gpu.idle_ms_per_step) if r.gpu else ms


def _sync_bound(r: RankSummary) -> float:
    """A sync's removal cannot win the time its rank waits for late arrivers: the collective still waits for them."""
    return _host_fix_bound(r, max(r.mean_phases.sync - r.waits_for_others_ms, 0.0))


def _finding(code: str, r: RankSummary, saving_ms: float, *, title: str, evidence: str, fix: str, ranks: list[int], severity: str | None = None) -> Finding:
    """A finding whose evidence ends with its bound, as a warning when the bound is a large share of the step."""
    fraction = _share(r, saving_ms)
    bound = (
        f" Fixing it saves at most {saving_ms:.1f} ms ({fraction:.0%}) of the {r.mean_step_ms or 0:.1f} ms {_step_word(r)} on rank {r.rank}."
        if saving_ms > 0
        else ""
    )
    return Finding(
        code=code,  # type: ignore[arg-type]
        severity=severity or ("warning" if fraction >= WARNING_SAVING_FRACTION else "info"),  # type: ignore[arg-type]
        title=title,
        evidence=evidence + bound,
        fix=fix,
        ranks=ranks,
        max_saving_ms=saving_ms,
        max_saving_fraction=fraction,
    )


def dataloader_bound(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The step waits for the next batch."""
    hit = [r for r in ranks if _share(r, r.mean_phases.data) >= DATALOADER_BOUND_FRACTION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: _share(r, r.mean_phases.data))
    in_process = any(r.data_loader == "_SingleProcessDataLoaderIter" for r in hit)
    return _finding(
        "dataloader_bound",
        worst,
        _host_fix_bound(worst, worst.mean_phases.data),
        title=f"Data loading takes {_share(worst, worst.mean_phases.data):.0%} of the step",
        evidence=(
            f"DataLoader next() takes {worst.mean_phases.data:.1f} ms of a {worst.mean_step_ms:.1f} ms step on rank {worst.rank}"
            f"; over {DATALOADER_BOUND_FRACTION:.0%} on {_ranks(hit)}."
            + (" The loader runs in the training process (num_workers=0)." if in_process else "")
        ),
        fix=(
            "Load batches in parallel with the step: raise DataLoader num_workers (e.g. to the CPU cores per GPU), "
            "set persistent_workers=True and pin_memory=True, and move per-item work (decoding, augmentation) "
            "out of __getitem__ or into a preprocessed dataset."
        ),
        ranks=[r.rank for r in hit],
    )


def host_sync(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The host waits for a device value in every step (``loss.item()``, ``.cpu()``, a blocking device-to-host copy)."""
    hit = [r for r in ranks if r.steps and all(s.sync_calls > 0 for s in r.steps)]
    if not hit:
        return None
    worst = max(hit, key=_sync_bound)
    calls = sum(s.sync_calls for s in worst.steps) / len(worst.steps)
    names = ", ".join(op.name for op in worst.sync_ops) or "sync"
    on_device = worst.device != "cpu"
    saving = _sync_bound(worst)
    if on_device and _share(worst, saving) < MIN_SYNC_SAVING_FRACTION:
        return None
    bounded = ""
    if on_device and saving < worst.mean_phases.sync:
        bounded = f" The device is idle only {worst.gpu.idle_ms_per_step:.1f} ms per step, so removing the waits cannot win more."
    waiters = [r for r in hit if r.waits_for_others_ms > 0]
    if waiters:
        bounded += (
            f" On {_ranks(waiters)} the waits are mostly for late-arriving ranks (up to "
            f"{max(r.waits_for_others_ms for r in waiters):.1f} ms), which removing them would not win back."
        )
    return _finding(
        "host_sync",
        worst,
        saving,
        severity="warning" if on_device and _share(worst, saving) >= HOST_SYNC_FRACTION else "info",
        title="The host waits for a device value every step",
        evidence=(
            f"{calls:.0f} wait(s) per step on {_ranks(hit)} ({names}); {worst.mean_phases.sync:.2f} ms "
            f"({_share(worst, worst.mean_phases.sync):.1%}) of the step on rank {worst.rank}."
            + (bounded if on_device else " This trace is CPU-only, where it is cheap; on a GPU each call waits for every queued kernel.")
        ),
        fix=(
            "Keep loss.item(), .cpu(), .tolist() and printing tensors off the per-step path: accumulate the loss on the "
            "device and read it every N steps, or copy it with non_blocking=True into a pinned buffer and read it after "
            "a CUDA event has completed. Pinning memory does not help here: the wait is for the kernels queued before the read."
        ),
        ranks=[r.rank for r in hit],
    )


def _uploads(r: RankSummary) -> list[CopyStats]:
    return [c for c in r.copies if c.direction in ("HtoD", "HtoH", "other") and c.host_blocked_ms_per_step > 0]


def htod_copy(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Host-to-device copies block the host (device-to-host ones are waits, device-to-device ones never block it)."""
    hit = [r for r in ranks if _share(r, r.mean_phases.memcpy) >= MEMCPY_FRACTION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: _host_fix_bound(r, r.mean_phases.memcpy))
    uploads = _uploads(worst)
    parts = [
        f"{c.calls_per_step:.0f} {c.host_memory or 'unnamed-memory'} {c.direction} ({c.host_blocked_ms_per_step:.2f} ms blocked)"
        for c in uploads
    ]
    pageable = any(c.host_memory != "pinned" for c in uploads) or not uploads
    fix = (
        "Set pin_memory=True on the DataLoader (or .pin_memory() the tensor) and copy with tensor.to(device, non_blocking=True), "
        "so the copy overlaps compute instead of stalling the host; create constant tensors on the device directly."
        if pageable
        else "The source is already pinned: copy with non_blocking=True (and prefetch the next batch to the device on a side "
        "stream) so the host does not wait for the copy."
    )
    return _finding(
        "htod_copy",
        worst,
        _host_fix_bound(worst, worst.mean_phases.memcpy),
        title=f"Host-to-device copies block the host for {_share(worst, worst.mean_phases.memcpy):.0%} of the step",
        evidence=(
            f"Copies to the device hold the host {worst.mean_phases.memcpy:.2f} ms of a {worst.mean_step_ms:.1f} ms step on rank "
            f"{worst.rank}; over {MEMCPY_FRACTION:.0%} on {_ranks(hit)}."
            + (f" Per step: {', '.join(parts)}." if parts else "")
        ),
        fix=fix,
        ranks=[r.rank for r in hit],
    )


_WAITING_PHASES = ("data", "sync", "memcpy", "comm")


def _unexplained_idle(r: RankSummary) -> float:
    """Device idle time per step beyond the host's waits (data, sync, copies, collectives) that other findings name."""
    return max(r.gpu.idle_ms_per_step - sum(r.mean_phases.get(p) for p in _WAITING_PHASES), 0.0) if r.gpu else 0.0


def low_gpu_utilization(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The device idles for much of the step, and not (only) because the host waits for data, syncs or copies.

    Its bound is the idle time the host's waits do not explain: the host
    queues work too slowly (Python and op dispatch, many small kernels).
    Idle time the waits explain is counted in those findings, not twice.
    """
    hit = [r for r in ranks if r.gpu is not None and r.mean_step_ms and r.gpu.utilization < LOW_GPU_UTILIZATION]
    if not hit:
        return None
    worst = min(hit, key=lambda r: r.gpu.utilization)
    if _share(worst, _unexplained_idle(worst)) < WARNING_SAVING_FRACTION:
        return None  # the host's waits explain the idle time; their findings say what to fix
    waits = {p: worst.mean_phases.get(p) for p in _WAITING_PHASES if worst.mean_phases.get(p) > 0}
    named = ", ".join(f"{p} {ms:.1f} ms" for p, ms in sorted(waits.items(), key=lambda kv: -kv[1]))
    return _finding(
        "low_gpu_utilization",
        worst,
        _unexplained_idle(worst),
        title=f"The {_DEVICE_NAMES[worst.device]} device is busy {worst.gpu.utilization:.0%} of the {_step_word(worst)}",
        evidence=(
            f"Kernels and copies cover {worst.gpu.utilization:.0%} of the {_step_word(worst)} on rank {worst.rank} "
            f"({worst.gpu.kernel_ms_per_step:.1f} ms of kernels, {worst.gpu.idle_ms_per_step:.1f} ms idle per "
            f"{worst.mean_step_ms:.1f} ms); under {LOW_GPU_UTILIZATION:.0%} on {_ranks(hit)}."
            + (f" The host waits explain part of the idle time ({named}); the rest is the host queueing work too slowly." if named else "")
        ),
        fix=(
            "Give the device more work per launch and the host less per step: a larger batch, torch.compile or CUDA graphs "
            "for many small kernels, fused optimizers (foreach/fused=True), bf16 autocast."
        ),
        ranks=[r.rank for r in hit],
    )


def gpu_bound(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The device is busy nearly all the step: only faster device work shortens it; name the kernels."""
    hit = [r for r in ranks if r.gpu is not None and r.mean_step_ms and r.gpu.utilization >= GPU_BOUND_UTILIZATION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: r.gpu.utilization)
    per_step = max(len(worst.steps), 1)
    # Collective kernels run beside compute and wait for peers: they are the comm finding's, not a kernel to tune.
    top = [k for k in worst.top_kernels if not _COMM_KERNEL.match(k.name)][:GPU_BOUND_TOP_KERNELS]
    listed = "; ".join(f"{k.name[:80]} {k.total_ms / per_step:.2f} ms ({_share(worst, k.total_ms / per_step):.0%})" for k in top)
    return _finding(
        "gpu_bound",
        worst,
        min(sum(k.total_ms for k in top) / per_step, worst.gpu.busy_ms_per_step),
        severity="info",
        title=f"GPU-bound: the device is busy {worst.gpu.utilization:.0%} of the step",
        evidence=(
            f"Device work covers {worst.gpu.utilization:.0%} of the step on rank {worst.rank} (at least "
            f"{GPU_BOUND_UTILIZATION:.0%} on {_ranks(hit)}): host-side fixes cannot win more than its "
            f"{worst.gpu.idle_ms_per_step:.1f} ms of idle time. Top kernels per step: {listed}."
        ),
        fix=(
            "Make the device work cheaper: bf16/fp8 autocast, torch.compile to fuse the small elementwise kernels, "
            "fused optimizers (foreach/fused=True), FlashAttention/SDPA for attention; check that the top kernels use "
            "tensor cores (channels_last, dimensions that are multiples of 8)."
        ),
        ranks=[r.rank for r in hit],
    )


def comm_exposed(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Collectives do not overlap compute: even the least-waiting rank waits.

    The least-waiting rank is used because the others' wait includes waiting
    for stragglers, which the straggler finding reports instead.
    """
    timed = [r for r in ranks if r.mean_step_ms]
    if not timed:
        return None
    least = min(timed, key=lambda r: _share(r, r.comm_wait_ms))
    if _share(least, least.comm_wait_ms) < COMM_EXPOSED_FRACTION:
        return None
    overlap = ""
    if least.gpu and least.gpu.comm_overlap is not None:
        overlap = f" Only {least.gpu.comm_overlap:.0%} of collective kernel time overlaps compute kernels."
    if len(timed) == 1:
        # With no other rank to compare, a wait for a slower peer looks the same as an exposed collective.
        overlap += " Only this rank's trace was analysed: part of the wait may be for slower ranks; analyse all ranks to tell."
    return _finding(
        "comm_exposed",
        least,
        least.comm_wait_ms,
        title="Communication does not overlap computation",
        evidence=(
            f"Even the rank that waits least (rank {least.rank}) spends {least.comm_wait_ms:.1f} ms "
            f"({_share(least, least.comm_wait_ms):.0%}) of its {least.mean_step_ms:.1f} ms step in collectives; "
            + ", ".join(f"rank {r.rank}: {r.comm_wait_ms:.1f} ms" for r in timed)
            + "."
            + overlap
        ),
        fix=(
            "Let gradient communication run during backward: use DDP/FSDP rather than an all_reduce after backward, "
            "tune DDP bucket_cap_mb so the first buckets start early, accumulate gradients under no_sync() across "
            "micro-batches, or compress gradients (DDP comm hooks, bf16)."
        ),
        ranks=[least.rank],
    )


def straggler(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> Finding | None:
    """One or more ranks hold the others back: busier each step, or starting it late."""
    if not stragglers:
        return None
    worst = max(stragglers, key=lambda s: s.excess_ms)
    others = [s for s in stragglers if s is not worst]
    by_rank = {r.rank: r for r in ranks}
    fixes = {
        "data": "its input pipeline is slower: check its data shard, storage locality and loader workers",
        "forward": "its forward does more work or runs slower: check uneven input sizes per rank, rank-gated extra work "
        "(logging, eval, checkpoints), and a throttled or shared device on its host",
    }
    if worst.cause == "late_arrival":
        title = f"Rank {worst.rank} starts its steps late; the others wait for it"
        evidence = (
            f"Rank {worst.rank} starts the step {worst.phase_excess_ms:.1f} ms after the earliest rank and waits only "
            f"{worst.comm_wait_ms:.1f} ms, while the ranks that started on time wait {worst.reference_comm_wait_ms:.1f} ms "
            "(in collectives or in cudaStreamSynchronize on them)."
        )
        fix = (
            "Look at what that rank does between steps, outside the profiled step: rank-gated work (logging, metrics, "
            "evaluation, checkpoint writes), a slower data fetch before the step marker, or a busier host; give every "
            "rank the same work between steps or move it off the critical path."
        )
    else:
        title = f"Rank {worst.rank} is a straggler ({worst.phase})"
        evidence = (
            f"Rank {worst.rank} is busy {worst.excess_ms:.1f} ms ({worst.excess_fraction:.0%} of the step) longer per step "
            f"than the other ranks, {worst.phase_excess_ms:.1f} ms of it in {worst.phase}. The others wait for it in "
            f"collectives ({worst.reference_comm_wait_ms:.1f} ms/step) while it waits {worst.comm_wait_ms:.1f} ms."
        )
        fix = (
            "Find what differs on that rank: "
            + fixes.get(worst.phase, f"compare its {worst.phase} spans with another rank's in the merged trace")
            + ". Every rank runs at the straggler's speed until it is fixed."
        )
    if others:
        evidence += " Also holding the others back: " + ", ".join(f"rank {s.rank} ({s.cause.replace('_', ' ')})" for s in others) + "."
    anchor = by_rank.get(worst.rank) or ranks[0]
    return _finding(
        "straggler", anchor, worst.excess_ms, title=title, evidence=evidence, fix=fix, ranks=[s.rank for s in stragglers]
    )


def memory_peak(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Allocated memory comes close to the device's capacity: a risk of running out, not a cost in step time."""
    hits = [(r, m) for r in ranks for m in r.memory if m.capacity_bytes and m.peak_bytes >= MEMORY_PEAK_FRACTION * m.capacity_bytes]
    if not hits:
        return None
    r, m = max(hits, key=lambda h: h[1].peak_bytes / h[1].capacity_bytes)
    gib = 1024**3
    hit_ranks = sorted({h[0].rank for h in hits})
    return _finding(
        "memory_peak",
        r,
        0.0,
        severity="warning",
        title=f"Memory peaks at {m.peak_bytes / m.capacity_bytes:.0%} of {m.device}",
        evidence=(
            f"Peak allocated {m.peak_bytes / gib:.2f} GiB of {m.capacity_bytes / gib:.2f} GiB on {m.device} of rank {r.rank}; "
            f"over {MEMORY_PEAK_FRACTION:.0%} on {'rank ' + str(hit_ranks[0]) if len(hit_ranks) == 1 else 'ranks ' + ', '.join(map(str, hit_ranks))}. "
            "This does not cost step time; it risks an out-of-memory error on a larger batch."
        ),
        fix=(
            "One larger batch or sequence from an OOM: use activation checkpointing or a smaller micro-batch with "
            "gradient accumulation, bf16 autocast, and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation."
        ),
        ranks=hit_ranks,
    )


RULES: tuple[Callable[[Sequence[RankSummary], Sequence[Straggler]], Finding | None], ...] = (
    straggler,
    dataloader_bound,
    comm_exposed,
    gpu_bound,
    low_gpu_utilization,
    host_sync,
    htod_copy,
    memory_peak,
)


def find_all(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> list[Finding]:
    """Every rule's finding, ranked by the step time its fix could save at most (then warnings first, then rule order)."""
    found = [f for rule in RULES if (f := rule(ranks, stragglers)) is not None]
    return sorted(found, key=lambda f: (-f.max_saving_ms, f.severity != "warning"))
