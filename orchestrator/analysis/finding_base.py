"""What every finding rule shares: how a finding states its bound, and the words it uses for ranks and steps."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.models.analysis import Finding, IdleCause, RankSummary

__all__ = [
    "DEVICE_NAMES",
    "OWN_FINDING_CAUSES",
    "REPORT_FRACTION",
    "WARNING_FRACTION",
    "claimed_causes",
    "host_fix_bound",
    "idle_text",
    "one_step_carries",
    "make_finding",
    "ranks_text",
    "share",
    "step_word",
]

# When a finding warns (docs/results.md, "When a finding warns"): the one named cause its fix removes (the DataLoader
# wait, a sync, pageable copies, exposed collectives, a straggler, the optimizer's host time, a region, the allocator,
# launch pace, ...) explains at least this share of the step. Below it, a finding is at most an info line. 8%: the
# TensorBoard plugin's num_workers=4 ResNet50 samples, healthy by the tutorial that made them, reach 7.1% at most
# (pageable uploads); the smallest cause to be told among the real traces, the sync drain of HTA's TorchRec-style
# A100 trace, is 8.6%. A judgement from those traces, stated in docs/results.md.
WARNING_FRACTION = 0.08
# Share of the step from which an idle cause with a finding of its own is reported at all (as info below WARNING_FRACTION).
REPORT_FRACTION = 0.05
DEVICE_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "mtia": "MTIA", "cpu": "CPU"}
# Idle causes with a finding of their own (DataLoader, sync, copy, collectives, late ranks), each when its idle
# time reaches REPORT_FRACTION of the step; the device-utilization finding counts the rest.
OWN_FINDING_CAUSES: tuple[IdleCause, ...] = ("data", "sync", "copy", "collective", "late_rank")


def ranks_text(ranks: Sequence[RankSummary]) -> str:
    ids = [r.rank for r in ranks]
    return f"rank {ids[0]}" if len(ids) == 1 else "ranks " + ", ".join(map(str, ids))


def share(r: RankSummary, ms: float) -> float:
    return ms / r.mean_step_ms if r.mean_step_ms else 0.0


def step_word(r: RankSummary) -> str:
    return {"whole_trace": "trace (no ProfilerStep)", "device_span": "device's active span (no ProfilerStep)"}.get(
        r.window, "iteration (no ProfilerStep)" if r.window == "iterations" else "step"
    )


def host_fix_bound(r: RankSummary, ms: float, *causes: IdleCause) -> float:
    """What removing a host-side cost can win: on a device, the idle time attributed to ``causes`` (the device
    was busy the rest of the host's time); on a CPU-only trace, the host time ``ms`` itself."""
    return r.idle.ms(*causes) if r.idle is not None else ms


# A cost is one step's when that step holds at least this share of the window's total of it, and the other steps'
# median is at most ONE_STEP_OTHERS_FRACTION of it: a one-off (the window's first step, an epoch's first batch, a
# pause of the machine) that a mean over a short window would make every step's.
ONE_STEP_SHARE = 0.5
ONE_STEP_OTHERS_FRACTION = 0.25


def one_step_carries(r: RankSummary, per_step: Sequence[float]) -> str:
    """Where one of three or more steps holds most of a cost (``per_step``, ms in each of ``r.steps``), the
    sentence that says so; otherwise ''. A finding that reads a mean says it, and does not warn on it."""
    if len(per_step) < 3 or len(per_step) != len(r.steps):
        return ""
    top = max(range(len(per_step)), key=per_step.__getitem__)
    others = sorted(v for i, v in enumerate(per_step) if i != top)
    median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
    if per_step[top] < ONE_STEP_SHARE * sum(per_step) or median > ONE_STEP_OTHERS_FRACTION * per_step[top]:
        return ""
    return (
        f" Most of it is one step: step {r.steps[top].step} has {per_step[top]:.1f} ms, the other {len(others)} "
        f"steps {median:.1f} ms (median). Profile more steps (--steps) to see whether it recurs, e.g. at each epoch's start."
    )


def claimed_causes(r: RankSummary) -> set[IdleCause]:
    """The idle causes of ``r`` that are large enough for a finding of their own."""
    if r.idle is None:
        return set()
    return {c.cause for c in r.idle.causes if c.cause in OWN_FINDING_CAUSES and share(r, c.ms_per_step) >= REPORT_FRACTION}


def idle_text(r: RankSummary, limit: int = 4) -> str:
    """The device's idle time by cause, largest first, in words."""
    if r.idle is None or not r.idle.causes:
        return ""
    parts = []
    for c in r.idle.causes[:limit]:
        named = f" ({', '.join(f'{o.name[:60]} {o.total_ms / max(len(r.steps), 1):.1f} ms' for o in c.top[:3])})" if c.top else ""
        parts.append(f"{c.ms_per_step:.1f} ms {c.label}{named}")
    return f"The device idles {r.idle.idle_ms_per_step:.1f} ms per {step_word(r)} on rank {r.rank}: " + "; ".join(parts) + "."


def make_finding(
    code: str, r: RankSummary, saving_ms: float, *, title: str, evidence: str, fix: str, ranks: list[int],
    severity: str | None = None, cause_ms: float | None = None,
) -> Finding:
    """A finding whose evidence ends with its bound, as a warning when its named cause (``cause_ms``, by default
    the bound itself) explains at least WARNING_FRACTION of the step: the one rule every finding follows.

    A device trace without ProfilerStep and without repeating iterations claims no saving: its one window may be
    mostly one-off work (initialisation, warm-up) that no step of a longer run pays for.
    """
    bound = ""
    if r.window == "device_span":
        saving_ms, severity = 0.0, "info"
        bound = (
            " No saving is claimed: the trace has no ProfilerStep and no repeating iteration, so its idle time may be "
            "one-off work; profile a few steps with a schedule to measure what a step loses."
        )
    fraction = share(r, saving_ms)
    cause_fraction = fraction if cause_ms is None or r.window == "device_span" else share(r, cause_ms)
    if saving_ms > 0:
        bound = f" Fixing it saves at most {saving_ms:.1f} ms ({fraction:.0%}) of the {r.mean_step_ms or 0:.1f} ms {step_word(r)} on rank {r.rank}."
    return Finding(
        code=code,  # type: ignore[arg-type]
        severity=severity or ("warning" if cause_fraction >= WARNING_FRACTION else "info"),  # type: ignore[arg-type]
        title=title,
        evidence=evidence + bound,
        fix=fix,
        ranks=ranks,
        max_saving_ms=saving_ms,
        max_saving_fraction=fraction,
    )
