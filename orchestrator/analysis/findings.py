"""Recommendations: plain-language findings tied to evidence, ranked by what they can win.

Each rule reads the per-rank and cross-rank results and either returns one
``Finding`` (what, evidence with numbers and ranks, a concrete fix) or nothing.
A job under every threshold below gets no findings at all, never generic advice.

Every finding states the step time its fix could save *at most*
(``max_saving_ms``), and findings are ranked by it; two claim none: the memory peak (a risk, not step time) and
activation checkpointing's recomputation (a trade for memory the trace rarely shows). On a device the bound is
the device idle time attributed to the finding's cause
(:mod:`orchestrator.analysis.idle`): removing a host-side cost (data loading,
a sync, a blocking copy) shortens the step only where the device was idle
waiting for it, never by the time the device stayed busy. So a wait during
which the device runs queued work is no finding, and a GPU-bound job gets its
kernels named instead. On a CPU-only trace the bound is the host time itself.
A finding is a warning when the named cause its fix removes explains at least
``WARNING_FRACTION`` of the step (docs/results.md, "When a finding warns"); below it,
at most an info line.

The host-side and job-wide rules are here; the device's are in
:mod:`orchestrator.analysis.device_findings`, the straggler's in :mod:`orchestrator.analysis.straggler_finding`,
the moving imbalance's in :mod:`orchestrator.analysis.imbalance`, the accumulation's early reductions in
:mod:`orchestrator.analysis.accumulation`, the garbage collector's pauses in :mod:`orchestrator.analysis.gc_finding`, anomaly detection's in
:mod:`orchestrator.analysis.anomaly`, activation checkpointing's in :mod:`orchestrator.analysis.recompute`, the loader restart's in
:mod:`orchestrator.analysis.epochs`, the slow link's in :mod:`orchestrator.analysis.groups`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.analysis.accumulation import accumulation_sync
from orchestrator.analysis.advice import round_trips
from orchestrator.analysis.anomaly import anomaly_mode
from orchestrator.analysis.compile_finding import compile_in_steps
from orchestrator.analysis.cores_finding import cores_shared
from orchestrator.analysis.data_fix import data_fix, data_where
from orchestrator.analysis.device_findings import comm_exposed, gpu_bound, low_gpu_utilization
from orchestrator.analysis.epochs import loader_restart
from orchestrator.analysis.evaluations import evaluation
from orchestrator.analysis.finding_base import (
    DEVICE_NAMES,
    REPORT_FRACTION,
    host_fix_bound,
    make_finding,
    one_step,
    per_step_cost,
    ranks_text,
    runtime_of,
    share,
    step_word,
)
from orchestrator.analysis.gc_finding import gc_pause
from orchestrator.analysis.generation import generation, rollout
from orchestrator.analysis.groups import slow_link
from orchestrator.analysis.host_python import host_python
from orchestrator.analysis.imbalance import moving_imbalance
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.optimizer_fix import optimizer_changes
from orchestrator.analysis.param_loops import param_loop
from orchestrator.analysis.precision import half_autocast, half_changes
from orchestrator.analysis.ray_findings import train_report
from orchestrator.analysis.readers import readers, reading_fix
from orchestrator.analysis.recompute import activation_recompute
from orchestrator.analysis.straggler_finding import straggler
from orchestrator.analysis.untraced import RAY_DATA_ITERATOR
from orchestrator.models.analysis import CopyStats, Finding, IdleCause, RankSummary, Straggler

__all__ = [
    "DATALOADER_BOUND_FRACTION",
    "MEMCPY_FRACTION",
    "MEMORY_PEAK_FRACTION",
    "MIN_SYNC_SAVING_FRACTION",
    "OPTIMIZER_OP_US",
    "RULES",
    "find_all",
]

# Share of the step spent waiting for the next batch (CPU-only traces; on a device, the idle time it explains).
DATALOADER_BOUND_FRACTION = 0.25
# Share of the step the host spends blocked in host-to-device copies (CPU-only traces; on a device, the idle time).
MEMCPY_FRACTION = 0.05
# Share of a device's memory that the peak allocation reaches.
MEMORY_PEAK_FRACTION = 0.9
# On a device, a per-step sync whose removal could save less than this share of the step is not reported.
MIN_SYNC_SAVING_FRACTION = 0.01
# CPU-only traces: mean host µs per top-level op of the optimizer under which its time is per-op overhead (dispatch,
# and the profiler's own cost), not arithmetic: a per-parameter loop that a foreach or fused optimizer replaces.
# Issue 29's CPU recordings: Adam(foreach=False) over 80 to 4,000 tiny parameters 5-7 µs; Adam over an MLP's 6
# parameters 25-55 µs (its ops do the arithmetic); HF's fused AdamW 4 ops of over 100 µs each.
OPTIMIZER_OP_US = 15.0


def _on_device(r: RankSummary, cause: IdleCause, phase_ms: float, host_fraction: float) -> bool:
    """Whether ``cause`` is worth a finding on ``r``: on a device, when the idle time it explains reaches
    ``REPORT_FRACTION`` of the step; on a CPU-only trace, when the host time reaches ``host_fraction``."""
    if r.idle is not None:
        return share(r, r.idle.ms(cause)) >= REPORT_FRACTION
    return share(r, phase_ms) >= host_fraction


def _idle_of(r: RankSummary, cause: IdleCause, host_ms: float, busy_with: str = "queued work") -> str:
    """How much of a host cost of ``host_ms`` left the device idle, on a device trace."""
    if r.idle is None:
        return ""
    idle = r.idle.ms(cause)
    rest = f" and runs {busy_with} for the rest" if idle < 0.95 * host_ms else ""
    return f" The device idles {idle:.1f} ms of that time{rest}."


def dataloader_bound(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The device (or the CPU-only step) waits for the next batch."""
    hit = [r for r in ranks if _on_device(r, "data", r.mean_phases.data, DATALOADER_BOUND_FRACTION)]
    if not hit:
        return None
    worst = max(hit, key=lambda r: share(r, host_fix_bound(r, r.mean_phases.data, "data")))
    in_process = any(r.data_loader == "_SingleProcessDataLoaderIter" for r in hit)
    one_off = one_step(worst, per_step_cost(worst, ["data"], "data"))
    return make_finding(
        "dataloader_bound",
        worst,
        host_fix_bound(worst, worst.mean_phases.data, "data"),
        title=f"Data loading takes {share(worst, worst.mean_phases.data):.0%} of the {step_word(worst)}"
        + (f", {one_off.fraction:.0%} of it in {one_off.label(worst)}" if one_off is not None else ""),
        evidence=(
            f"{_loader_read(worst)} takes {worst.mean_phases.data:.1f} ms of a {worst.mean_step_ms:.1f} ms {step_word(worst)} on rank {worst.rank}."
            f"{data_where(worst)}{_idle_of(worst, 'data', worst.mean_phases.data)} Found on {ranks_text(hit)}."
            + (" The loader runs in the step's own process (num_workers=0)." if in_process else "")
        ),
        fix=data_fix(worst, steady=one_off is None),
        ranks=[r.rank for r in hit],
        one_off=one_off,
    )


def _loader_read(r: RankSummary) -> str:
    return "Ray Data's iterator (the next batch)" if r.data_loader == RAY_DATA_ITERATOR else "DataLoader next()"


def _us_per_optimizer_op(r: RankSummary) -> float:
    return 1000 * r.mean_phases.optimizer / r.optimizer_ops if r.optimizer_ops else float("inf")


def optimizer_host(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """On a CPU-only trace, the optimizer spends its time issuing small per-parameter ops (on a device, the
    device-utilization finding names the optimizer's host time by the idle time it leaves)."""
    hit = [
        r for r in ranks
        if r.gpu is None and r.idle is None and _us_per_optimizer_op(r) < OPTIMIZER_OP_US
        and share(r, r.mean_phases.optimizer) >= REPORT_FRACTION
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda r: share(r, r.mean_phases.optimizer))
    return make_finding(
        "optimizer_host",
        worst,
        host_fix_bound(worst, worst.mean_phases.optimizer),
        title=f"The optimizer takes {share(worst, worst.mean_phases.optimizer):.0%} of the step in small per-parameter ops",
        evidence=(
            f"Optimizer.step and zero_grad take {worst.mean_phases.optimizer:.1f} ms of a {worst.mean_step_ms:.1f} ms step on "
            f"rank {worst.rank}, in {worst.optimizer_ops:.0f} ops per step of {_us_per_optimizer_op(worst):.1f} µs each: "
            f"per-op overhead, not arithmetic. Found on {ranks_text(hit)}."
        ),
        fix=(
            f"Update all parameters in a few ops {changes} Fewer, larger parameters (one wide layer rather than many "
            "tiny ones) help likewise."
            if (changes := optimizer_changes(worst)) is not None
            else "Update all parameters in a few ops: a fused or foreach optimizer (e.g. torch.optim.AdamW(params, "
            "fused=True), on CPU and GPU, or foreach=True), zero_grad(set_to_none=True), or torch.compile the optimizer "
            "step; fewer, larger parameters (one wide layer rather than many tiny ones) help likewise."
        ),
        ranks=[r.rank for r in hit],
    )


def host_sync(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The host waits for a device value in every step (``loss.item()``, ``.cpu()``, a blocking device-to-host copy),
    and the device idles during the wait (it drained its queue, or the value is needed to launch more)."""
    every_step = [r for r in ranks if r.steps and all(s.sync_calls > 0 for s in r.steps)]
    hit = [
        r for r in every_step
        if r.idle is None or share(r, r.idle.ms("sync")) >= MIN_SYNC_SAVING_FRACTION
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda r: host_fix_bound(r, r.mean_phases.sync, "sync"))
    calls = sum(s.sync_calls for s in worst.steps) / len(worst.steps)
    names = ", ".join(op.name for op in worst.sync_ops) or "sync"
    on_device = worst.idle is not None
    saving = host_fix_bound(worst, worst.mean_phases.sync, "sync")
    waiters = [r for r in every_step if r.waits_for_others_ms > 0]
    late = ""
    if waiters:
        late = (
            f" On {ranks_text(waiters)} the waits are partly for late-arriving ranks (up to "
            f"{max(r.waits_for_others_ms for r in waiters):.1f} ms), which removing them would not win back."
        )
    return make_finding(
        "host_sync",
        worst,
        saving,
        severity=None if on_device else "info",
        title="The host waits for a device value every step",
        evidence=(
            f"{calls:.0f} {'wait' if round(calls) == 1 else 'waits'} per step on {ranks_text(hit)} ({names}); {worst.mean_phases.sync:.2f} ms "
            f"({share(worst, worst.mean_phases.sync):.1%}) of the step on rank {worst.rank}."
            + (_idle_of(worst, "sync", worst.mean_phases.sync) if on_device else _unmeasured(worst))
            + (" The device idle time counted includes the gaps after each wait while the host launches anew "
               "(the wait emptied the device's queue), up to the device work it waited out." if on_device else "")
            + late
            + (f" Made by (Python, innermost frame of your or a library's code): {by}." if (by := readers(worst)) else "")
        ),
        one_off=one_step(worst, per_step_cost(worst, ["sync"], "sync")) if on_device else None,
        fix=reading_fix(worst),
        ranks=[r.rank for r in hit],
    )


def _unmeasured(r: RankSummary) -> str:
    if r.unrecorded_device:
        cupti = ", or CUPTI's range profiler took the kernels" if r.unrecorded_device == "cuda" else ""
        return (f" The trace holds {DEVICE_NAMES[r.unrecorded_device]} runtime calls but no device activity (device tracing "
                f"was off or failed{cupti}): what each wait for queued kernels costs is not measured.")
    return (" This trace is CPU-only, where it is cheap; on a GPU each read of a device tensor waits for every queued kernel "
            "(a read of a CPU tensor, such as DDP's map of used parameters, does not).")


def _uploads(r: RankSummary) -> list[CopyStats]:
    return [c for c in r.copies if c.direction in ("HtoD", "HtoH", "other") and c.host_blocked_ms_per_step > 0]


def _pageable(r: RankSummary) -> list[CopyStats]:
    """Copies to or from pageable host memory: on a device, their device time is staging, not useful work."""
    return [c for c in r.copies if c.host_memory == "pageable" and c.direction in ("HtoD", "DtoH")] if r.gpu is not None else []


def _copy_cost(r: RankSummary) -> float:
    """What the copy fix can win per step: the idle time the host spends blocked in uploads, plus the device time
    of pageable copies (pinned, non_blocking copies overlap compute; copies that are not made cost nothing)."""
    return host_fix_bound(r, r.mean_phases.memcpy, "copy") + sum(c.device_ms_per_step for c in _pageable(r))


def htod_copy(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Copies block the host while the device idles, or occupy the device copying pageable memory (device-to-host
    reads are waits, the sync finding's; device-to-device copies never block the host). Names who issues them."""
    hit = [r for r in ranks if share(r, _copy_cost(r)) >= (REPORT_FRACTION if r.idle is not None else MEMCPY_FRACTION)]
    if not hit:
        return None
    worst = max(hit, key=_copy_cost)
    per_step = max(len(worst.steps), 1)
    shown = [c for c in worst.copies if c in _uploads(worst) or c in _pageable(worst)]
    parts = [
        f"{c.calls_per_step:.0f} {c.host_memory or 'unnamed-memory'} {c.direction} ({c.device_ms_per_step:.2f} ms on the device, "
        f"{c.host_blocked_ms_per_step:.2f} ms blocked"
        + (f"; issued by {', '.join(f'{o.name} {o.total_ms / per_step:.2f} ms' for o in c.issued_by[:3])}" if c.issued_by else "")
        + ")"
        for c in shown
    ]
    pageable_ms = sum(c.device_ms_per_step for c in _pageable(worst))
    trips = round_trips(worst)
    uploads = _uploads(worst)
    if trips:
        region, ms = max(trips.items(), key=lambda kv: kv[1])
        fix = (
            f"The region {region!r} copies to the host and back ({ms:.1f} ms of pageable copies per step): compute it on "
            "the device (torch.nonzero / torch.argwhere / boolean masks on the device tensor) and drop the .cpu() / "
            ".numpy() round trip."
        )
    elif any(c.host_memory != "pinned" for c in uploads) or (not uploads and not pageable_ms):
        fix = (
            "Set pin_memory=True on the DataLoader (or .pin_memory() the tensor) and copy with tensor.to(device, non_blocking=True), "
            "so the copy overlaps compute instead of stalling the host; create constant tensors on the device directly."
        )
    elif uploads:
        fix = (
            "The source is already pinned: copy with non_blocking=True (and prefetch the next batch to the device on a side "
            "stream) so the host does not wait for the copy."
        )
    else:
        fix = (
            "Keep the values on the device; where the host needs them, copy them with non_blocking=True into a pinned "
            f"buffer and read it after {runtime_of(worst.device).event} has completed."
        )
    title = (
        f"Copies to and from pageable memory cost {share(worst, _copy_cost(worst)):.0%} of the step" if pageable_ms
        else f"Host-to-device copies block the host for {share(worst, worst.mean_phases.memcpy):.0%} of the step"
    )
    return make_finding(
        "htod_copy",
        worst,
        _copy_cost(worst),
        title=title,
        evidence=(
            f"Copies to the device hold the host {worst.mean_phases.memcpy:.2f} ms of a {worst.mean_step_ms:.1f} ms step on rank "
            f"{worst.rank}.{_idle_of(worst, 'copy', worst.mean_phases.memcpy, 'the copies or queued work')}"
            + (f" Copies to or from pageable memory occupy the device {pageable_ms:.2f} ms a step, staged through a bounce "
               "buffer while the host waits." if pageable_ms else "")
            + f" Found on {ranks_text(hit)}."
            + (f" Per step: {'; '.join(parts)}." if parts else "")
        ),
        fix=fix,
        ranks=[r.rank for r in hit],
        # Only the host-blocked part is known step by step; pageable copies' device time is a mean.
        one_off=None if pageable_ms else one_step(worst, per_step_cost(worst, ["copy"], "memcpy")),
    )


def memory_peak(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Allocated memory comes close to the device's capacity: a risk of running out, not a cost in step time."""
    hits = [(r, m) for r in ranks for m in r.memory if m.capacity_bytes and m.peak_bytes >= MEMORY_PEAK_FRACTION * m.capacity_bytes]
    if not hits:
        return None
    r, m = max(hits, key=lambda h: h[1].peak_bytes / h[1].capacity_bytes)
    gib = 1024**3
    hit_ranks = sorted({h[0].rank for h in hits})
    return make_finding(
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
            f"gradient accumulation, {half_autocast(r.accelerator)}"
            + (f", and {segments} against fragmentation." if (segments := runtime_of(r.device).expandable_segments) else ".")
            + in_loop(
                r.loop, [Change.CHECKPOINT_ACTIVATIONS, Change.ACCUMULATE, *half_changes(r.accelerator)]
            )
        ),
        ranks=hit_ranks,
    )


RULES: tuple[Callable[[Sequence[RankSummary], Sequence[Straggler]], Finding | None], ...] = (
    gc_pause,
    anomaly_mode,
    straggler,
    cores_shared,
    moving_imbalance,
    loader_restart,
    train_report,
    evaluation,
    compile_in_steps,
    host_python,
    slow_link,
    dataloader_bound,
    optimizer_host,
    param_loop,
    generation,
    rollout,
    accumulation_sync,
    comm_exposed,
    gpu_bound,
    low_gpu_utilization,
    host_sync,
    htod_copy,
    memory_peak,
    activation_recompute,
)


def find_all(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> list[Finding]:
    """Every rule's finding, ranked by the step time its fix could save at most (then warnings first, then rule order)."""
    found = [f for rule in RULES if (f := rule(ranks, stragglers)) is not None]
    return sorted(found, key=lambda f: (-f.max_saving_ms, f.severity != "warning"))
