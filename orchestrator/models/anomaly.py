"""One step's cost of autograd's anomaly detection, as a rank's summary keeps it (:mod:`orchestrator.analysis.anomaly`
measures it)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["AnomalyChecks"]


class AnomalyChecks(StrictModel):
    """The engine's NaN checks in one step and forward's tracebacks."""

    checks: int = Field(ge=1, description="NaN checks of backward nodes' outputs (isnan, _is_any_true, item).")
    check_ms: float = Field(ge=0, description="Their time, each from its isnan's start to its read's end.")
    traceback_ms: float = Field(
        ge=0, description="Forward's tracebacks (torch/fx/traceback.py's format_stack) by the Python stack; 0 without one."
    )
    tracebacks_whole: bool = Field(
        default=False,
        description="with_stack frames timed the tracebacks whole; the agent's stack samples see a fraction of them "
        "(a sampler that waits for the GIL misses most of a 0.2 ms traceback between two ops that release it).",
    )
