"""What every finding rule shares: how a finding states its bound, and the words it uses for ranks and steps."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.models import Finding, RankSummary

__all__ = ["DEVICE_NAMES", "WARNING_SAVING_FRACTION", "host_fix_bound", "make_finding", "ranks_text", "share", "step_word"]

# Share of the step a fix must be able to save for its finding to be a warning.
WARNING_SAVING_FRACTION = 0.05
DEVICE_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "mtia": "MTIA", "cpu": "CPU"}


def ranks_text(ranks: Sequence[RankSummary]) -> str:
    ids = [r.rank for r in ranks]
    return f"rank {ids[0]}" if len(ids) == 1 else "ranks " + ", ".join(map(str, ids))


def share(r: RankSummary, ms: float) -> float:
    return ms / r.mean_step_ms if r.mean_step_ms else 0.0


def step_word(r: RankSummary) -> str:
    return "trace (no ProfilerStep)" if r.window == "whole_trace" else "step"


def host_fix_bound(r: RankSummary, ms: float) -> float:
    """At most the host time removed, and on a device at most its idle time: the step cannot beat the device."""
    return min(ms, r.gpu.idle_ms_per_step) if r.gpu else ms


def make_finding(code: str, r: RankSummary, saving_ms: float, *, title: str, evidence: str, fix: str, ranks: list[int], severity: str | None = None) -> Finding:
    """A finding whose evidence ends with its bound, as a warning when the bound is a large share of the step."""
    fraction = share(r, saving_ms)
    bound = (
        f" Fixing it saves at most {saving_ms:.1f} ms ({fraction:.0%}) of the {r.mean_step_ms or 0:.1f} ms {step_word(r)} on rank {r.rank}."
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
