"""A live run's step-time history as the API returns it: columns per rank, oldest first."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RankSeries", "TargetHistory"]


class RankSeries(BaseModel):
    """One rank's points at one resolution; the three lists have one entry per point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    t: list[float] = Field(default_factory=list, description="Unix time of the last heartbeat in each point.")
    step: list[int] = Field(default_factory=list, description="The rank's step count at that heartbeat.")
    step_time_s: list[float | None] = Field(
        default_factory=list, description="Mean step time the rank reported within the point (s); null when none."
    )


class TargetHistory(BaseModel):
    """Every rank of one run of a target, over the last ``span_s`` seconds at ``resolution_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    run: str | None = None
    resolution_s: float = Field(description="Width of one point: the finest tier that covers the span asked for.")
    span_s: float
    ranks: list[RankSeries] = Field(default_factory=list)
