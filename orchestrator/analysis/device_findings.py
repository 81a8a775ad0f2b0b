"""Findings about the device: it idles, it is the bottleneck, or collectives do not overlap compute."""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.analysis.finding_base import (
    DEVICE_NAMES,
    WARNING_SAVING_FRACTION,
    make_finding,
    ranks_text,
    share,
    step_word,
)
from orchestrator.analysis.models import Finding, RankSummary, Straggler

__all__ = [
    "COMM_EXPOSED_FRACTION",
    "GPU_BOUND_UTILIZATION",
    "LOW_GPU_UTILIZATION",
    "comm_exposed",
    "gpu_bound",
    "low_gpu_utilization",
]

# Busy share of the step on the GPU under which it is called underused.
LOW_GPU_UTILIZATION = 0.5
# Busy share of the step from which the job is GPU-bound: only faster kernels help.
GPU_BOUND_UTILIZATION = 0.9
# How many kernels the GPU-bound finding names.
GPU_BOUND_TOP_KERNELS = 5
# Share of the step that even the least-waiting rank waits in collectives.
COMM_EXPOSED_FRACTION = 0.25
_COMM_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)


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
    if share(worst, _unexplained_idle(worst)) < WARNING_SAVING_FRACTION:
        return None  # the host's waits explain the idle time; their findings say what to fix
    waits = {p: worst.mean_phases.get(p) for p in _WAITING_PHASES if worst.mean_phases.get(p) > 0}
    named = ", ".join(f"{p} {ms:.1f} ms" for p, ms in sorted(waits.items(), key=lambda kv: -kv[1]))
    return make_finding(
        "low_gpu_utilization",
        worst,
        _unexplained_idle(worst),
        title=f"The {DEVICE_NAMES[worst.device]} device is busy {worst.gpu.utilization:.0%} of the {step_word(worst)}",
        evidence=(
            f"Kernels and copies cover {worst.gpu.utilization:.0%} of the {step_word(worst)} on rank {worst.rank} "
            f"({worst.gpu.kernel_ms_per_step:.1f} ms of kernels, {worst.gpu.idle_ms_per_step:.1f} ms idle per "
            f"{worst.mean_step_ms:.1f} ms); under {LOW_GPU_UTILIZATION:.0%} on {ranks_text(hit)}."
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
    listed = "; ".join(f"{k.name[:80]} {k.total_ms / per_step:.2f} ms ({share(worst, k.total_ms / per_step):.0%})" for k in top)
    return make_finding(
        "gpu_bound",
        worst,
        min(sum(k.total_ms for k in top) / per_step, worst.gpu.busy_ms_per_step),
        severity="info",
        title=f"GPU-bound: the device is busy {worst.gpu.utilization:.0%} of the step",
        evidence=(
            f"Device work covers {worst.gpu.utilization:.0%} of the step on rank {worst.rank} (at least "
            f"{GPU_BOUND_UTILIZATION:.0%} on {ranks_text(hit)}): host-side fixes cannot win more than its "
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
    least = min(timed, key=lambda r: share(r, r.comm_wait_ms))
    if share(least, least.comm_wait_ms) < COMM_EXPOSED_FRACTION:
        return None
    overlap = ""
    if least.gpu and least.gpu.comm_overlap is not None:
        overlap = f" Only {least.gpu.comm_overlap:.0%} of collective kernel time overlaps compute kernels."
    if len(timed) == 1:
        # With no other rank to compare, a wait for a slower peer looks the same as an exposed collective.
        overlap += " Only this rank's trace was analysed: part of the wait may be for slower ranks; analyse all ranks to tell."
    return make_finding(
        "comm_exposed",
        least,
        least.comm_wait_ms,
        title="Communication does not overlap computation",
        evidence=(
            f"Even the rank that waits least (rank {least.rank}) spends {least.comm_wait_ms:.1f} ms "
            f"({share(least, least.comm_wait_ms):.0%}) of its {least.mean_step_ms:.1f} ms step in collectives; "
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
