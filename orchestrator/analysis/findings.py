"""Recommendations: plain-language findings tied to evidence, silent on a healthy job.

Each rule reads the per-rank and cross-rank results and either returns one
``Finding`` (what, evidence with numbers and ranks, a concrete fix) or nothing.
The thresholds are the named constants below; a job under all of them gets no
findings at all, never generic advice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.analysis.models import Finding, RankSummary, Straggler

__all__ = [
    "COMM_EXPOSED_FRACTION",
    "RULES",
    "DATALOADER_BOUND_FRACTION",
    "HOST_SYNC_FRACTION",
    "LOW_GPU_UTILIZATION",
    "MEMCPY_FRACTION",
    "MEMORY_PEAK_FRACTION",
    "find_all",
]

# Share of the step spent waiting for the next batch.
DATALOADER_BOUND_FRACTION = 0.25
# Share of the step spent in device-to-host syncs before a per-step sync is a warning
# (below it, a sync in every step is still reported, as info).
HOST_SYNC_FRACTION = 0.05
# Share of the step spent in host-device copies.
MEMCPY_FRACTION = 0.05
# Busy share of the step on the GPU under which it is called underused.
LOW_GPU_UTILIZATION = 0.5
# Share of the step that even the least-waiting rank waits in collectives.
COMM_EXPOSED_FRACTION = 0.25
# Share of a device's memory that the peak allocation reaches.
MEMORY_PEAK_FRACTION = 0.9


def _ranks(ranks: Sequence[RankSummary]) -> str:
    ids = [r.rank for r in ranks]
    return f"rank {ids[0]}" if len(ids) == 1 else "ranks " + ", ".join(map(str, ids))


def _share(r: RankSummary, ms: float) -> float:
    return ms / r.mean_step_ms if r.mean_step_ms else 0.0


def dataloader_bound(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The step waits for the next batch."""
    hit = [r for r in ranks if _share(r, r.mean_phases.data) >= DATALOADER_BOUND_FRACTION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: _share(r, r.mean_phases.data))
    in_process = any(r.data_loader == "_SingleProcessDataLoaderIter" for r in hit)
    return Finding(
        code="dataloader_bound",
        severity="warning",
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
    """A device-to-host sync in every step (``loss.item()``, ``.cpu()``, printing a tensor)."""
    hit = [r for r in ranks if r.steps and all(s.sync_calls > 0 for s in r.steps)]
    if not hit:
        return None
    worst = max(hit, key=lambda r: _share(r, r.mean_phases.sync))
    calls = sum(s.sync_calls for s in worst.steps) / len(worst.steps)
    share = _share(worst, worst.mean_phases.sync)
    names = ", ".join(op.name for op in worst.sync_ops) or "sync"
    on_gpu = worst.device == "cuda"
    return Finding(
        code="host_sync",
        severity="warning" if on_gpu and share >= HOST_SYNC_FRACTION else "info",
        title="The host waits for a device value every step",
        evidence=(
            f"{calls:.0f} sync call(s) per step on {_ranks(hit)} ({names}); {worst.mean_phases.sync:.2f} ms "
            f"({share:.1%}) of the step on rank {worst.rank}."
            + ("" if on_gpu else " This trace is CPU-only, where it is cheap; on a GPU each call waits for every queued kernel.")
        ),
        fix=(
            "Keep loss.item(), .cpu(), .tolist() and printing tensors off the per-step path: accumulate the loss on the "
            "device and read it every N steps, or log from a detached copy with non_blocking=True."
        ),
        ranks=[r.rank for r in hit],
    )


def htod_copy(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Host-device copies block the host."""
    hit = [r for r in ranks if _share(r, r.mean_phases.memcpy) >= MEMCPY_FRACTION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: _share(r, r.mean_phases.memcpy))
    per_step = sum(s.copy_calls for s in worst.steps) / max(len(worst.steps), 1)
    pageable = ""
    if worst.gpu and worst.gpu.htod_copies_per_step:
        pageable = (
            f" {worst.gpu.pageable_htod_copies_per_step:.0f} of {worst.gpu.htod_copies_per_step:.0f} host-to-device "
            "copies per step read pageable (unpinned) memory."
        )
    return Finding(
        code="htod_copy",
        severity="warning",
        title=f"Host-device copies take {_share(worst, worst.mean_phases.memcpy):.0%} of the step",
        evidence=(
            f"{per_step:.0f} blocking copies per step take {worst.mean_phases.memcpy:.2f} ms of a "
            f"{worst.mean_step_ms:.1f} ms step on rank {worst.rank}; over {MEMCPY_FRACTION:.0%} on {_ranks(hit)}." + pageable
        ),
        fix=(
            "Set pin_memory=True on the DataLoader and copy with tensor.to(device, non_blocking=True), so the copy "
            "overlaps compute instead of stalling the host; create constant tensors on the device directly."
        ),
        ranks=[r.rank for r in hit],
    )


def low_gpu_utilization(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The GPU idles for much of the step."""
    hit = [r for r in ranks if r.gpu is not None and r.gpu.utilization < LOW_GPU_UTILIZATION]
    if not hit:
        return None
    worst = min(hit, key=lambda r: r.gpu.utilization)
    host = {p: worst.mean_phases.get(p) for p in ("data", "sync", "memcpy", "comm", "other")}
    top = max(host, key=host.__getitem__)
    return Finding(
        code="low_gpu_utilization",
        severity="warning",
        title=f"The GPU is busy {worst.gpu.utilization:.0%} of the step",
        evidence=(
            f"Kernels and copies cover {worst.gpu.utilization:.0%} of step time on rank {worst.rank} "
            f"({worst.gpu.kernel_ms_per_step:.1f} ms of kernels per {worst.mean_step_ms:.1f} ms step); under "
            f"{LOW_GPU_UTILIZATION:.0%} on {_ranks(hit)}. The largest host-side phase is {top} ({host[top]:.1f} ms/step)."
        ),
        fix=(
            f"First remove what keeps the host from queueing work (here: {top}); then give the GPU more work per launch: "
            "a larger batch, torch.compile or CUDA graphs for many small kernels, bf16 autocast."
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
    return Finding(
        code="comm_exposed",
        severity="warning",
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
    """One or more ranks hold the others back."""
    if not stragglers:
        return None
    worst = max(stragglers, key=lambda s: s.excess_ms)
    fixes = {
        "data": "its input pipeline is slower: check its data shard, storage locality and loader workers",
        "forward": "its forward does more work or runs slower: check uneven input sizes per rank, rank-gated extra work "
        "(logging, eval, checkpoints), and a throttled or shared device on its host",
    }
    return Finding(
        code="straggler",
        severity="warning",
        title=f"Rank {worst.rank} is a straggler ({worst.phase})",
        evidence=(
            f"Rank {worst.rank} is busy {worst.excess_ms:.1f} ms ({worst.excess_fraction:.0%} of the step) longer per step "
            f"than the other ranks, {worst.phase_excess_ms:.1f} ms of it in {worst.phase}. The others wait for it in "
            f"collectives ({worst.reference_comm_wait_ms:.1f} ms/step) while it waits {worst.comm_wait_ms:.1f} ms."
            + (f" Also slow: {_ranks([s for s in stragglers if s is not worst])}." if len(stragglers) > 1 else "")
        ),
        fix=(
            "Find what differs on that rank: "
            + fixes.get(worst.phase, f"compare its {worst.phase} spans with another rank's in the merged trace")
            + ". Every rank runs at the straggler's speed until it is fixed."
        ),
        ranks=[s.rank for s in stragglers],
    )


def memory_peak(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Allocated memory comes close to the device's capacity."""
    hits = [
        (r, m)
        for r in ranks
        for m in r.memory
        if m.capacity_bytes and m.peak_bytes >= MEMORY_PEAK_FRACTION * m.capacity_bytes
    ]
    if not hits:
        return None
    r, m = max(hits, key=lambda h: h[1].peak_bytes / h[1].capacity_bytes)
    gib = 1024**3
    return Finding(
        code="memory_peak",
        severity="warning",
        title=f"Memory peaks at {m.peak_bytes / m.capacity_bytes:.0%} of {m.device}",
        evidence=(
            f"Peak allocated {m.peak_bytes / gib:.2f} GiB of {m.capacity_bytes / gib:.2f} GiB on {m.device} of rank {r.rank}; "
            f"over {MEMORY_PEAK_FRACTION:.0%} on {_ranks(sorted({h[0].rank: h[0] for h in hits}.values(), key=lambda x: x.rank))}."
        ),
        fix=(
            "One larger batch or sequence from an OOM: use activation checkpointing or a smaller micro-batch with "
            "gradient accumulation, bf16 autocast, and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation."
        ),
        ranks=sorted({h[0].rank for h in hits}),
    )


RULES: tuple[Callable[[Sequence[RankSummary], Sequence[Straggler]], Finding | None], ...] = (
    straggler,
    dataloader_bound,
    comm_exposed,
    low_gpu_utilization,
    host_sync,
    htod_copy,
    memory_peak,
)


def find_all(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> list[Finding]:
    """Every rule's finding, warnings first, in rule order."""
    found = [f for rule in RULES if (f := rule(ranks, stragglers)) is not None]
    return sorted(found, key=lambda f: f.severity != "warning")
