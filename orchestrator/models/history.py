"""A live run's step-time history as the API returns it: columns per rank, oldest first."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BandSeries", "RankSeries", "TargetHistory"]


class RankSeries(BaseModel):
    """One rank's points at one resolution; the three lists have one entry per point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    t: list[float] = Field(default_factory=list, description="Unix time of the last heartbeat in each point.")
    step: list[int] = Field(default_factory=list, description="The rank's step count at that heartbeat.")
    step_time_s: list[float | None] = Field(
        default_factory=list,
        description="Mean step time the rank reported within the point (s); null when none. In a downsampled "
        "answer, the median of the heartbeats' step times in the bucket.",
    )
    step_time_min_s: list[float | None] | None = Field(
        default=None, description="Downsampled answers only: the least step time in each bucket."
    )
    step_time_max_s: list[float | None] | None = Field(
        default=None, description="Downsampled answers only: the greatest step time in each bucket."
    )


class BandSeries(BaseModel):
    """Every rank of the run at once, per bucket: the spread a chart draws behind the ranks it shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t: list[float] = Field(default_factory=list, description="Unix time of each bucket's end.")
    step_time_min_s: list[float | None] = Field(default_factory=list)
    step_time_median_s: list[float | None] = Field(default_factory=list, description="Median of the ranks' medians.")
    step_time_max_s: list[float | None] = Field(default_factory=list)


class TargetHistory(BaseModel):
    """Every rank of one run of a target, over the last ``span_s`` seconds at ``resolution_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    run: str | None = None
    resolution_s: float = Field(description="Width of one point: the finest tier that covers the span asked for.")
    span_s: float
    ranks: list[RankSeries] = Field(default_factory=list)
    ranks_total: int | None = Field(
        default=None, description="Ranks with points in the span (of those asked for); more than in ranks when downsampled."
    )
    downsampled: bool = Field(
        default=False, description="Points are buckets of several heartbeats, and only the slowest ranks are listed."
    )
    band: BandSeries | None = Field(default=None, description="Every rank's spread, when not every rank is listed.")
