"""What activation checkpointing runs again in backward, per step, as a rank's summary keeps it
(:mod:`orchestrator.analysis.recompute` measures it)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["Recompute"]


class Recompute(StrictModel):
    """Forward ops that backward runs again (torch.utils.checkpoint's recomputation)."""

    ops: dict[str, float] = Field(description="Each recomputed op's calls per step, inside autograd nodes.")
    host_ms: list[float] = Field(description="Per step: the host time of those ops (the outermost where they nest).")
    device_ms: list[float] | None = Field(
        default=None, description="Per step: the device time of the kernels they launched; None on a CPU-only trace."
    )
