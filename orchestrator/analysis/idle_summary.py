"""A rank's idle attribution as the report shows it: each window's idle ms by cause, averaged per step, with what
names each cause (:mod:`orchestrator.analysis.idle` cuts the gaps; :mod:`orchestrator.analysis.cross` moves a late
rank's share to ``late_rank`` and summarizes again)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from orchestrator.models.analysis import IDLE_CAUSES, IDLE_LABELS, IdleAttribution, IdleCause, IdleShare

__all__ = ["NAMING_FIELDS", "summarize"]

# What names a cause's time (IdleShare's fields besides its figures): carried over when the figures change.
NAMING_FIELDS = (
    "top", "regions", "model_ops", "model_ops_ms", "host_only_ops", "host_op_callers", "python_frames", "python_frames_ms",
)


def summarize(
    per_window: Sequence[dict[IdleCause, float]], names: dict[IdleCause, dict[str, object]], step_ms: float | None = None
) -> IdleAttribution:
    """Per-step means of the windows' idle ms by cause, largest first, each with what names it (``names``: the ops,
    calls, regions and, for ``cpu``, the model's ops and the Python functions outside any op, summed over the steps)."""
    n = max(len(per_window), 1)
    sums: dict[IdleCause, float] = defaultdict(float)
    for row in per_window:
        for cause, ms in row.items():
            sums[cause] += ms
    idle = sum(sums.values()) / n
    step = step_ms or None
    causes = [
        IdleShare.model_validate(
            {
                "cause": cause, "label": IDLE_LABELS[cause], "ms_per_step": ms / n, "fraction_of_step": (ms / n / step) if step else 0.0,
                **names.get(cause, {}),
            }
        )
        for cause, ms in sorted(sums.items(), key=lambda kv: (-kv[1], IDLE_CAUSES.index(kv[0])))
        if ms > 0
    ]
    return IdleAttribution(idle_ms_per_step=idle, causes=causes)
