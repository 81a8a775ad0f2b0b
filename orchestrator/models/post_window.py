"""The post-window health check as a profile's status and manifest carry it.

After a window, each rank's step time after it is compared with its step time
before it (both from heartbeats, which cost training nothing). A profiler
that has not let go (pytorch/pytorch#144455: training stays 10-20% slower
after a window on some setups) shows as a rank that stays slower.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PostWindowCheck", "RankPostWindow", "Verdict"]

# pending: not enough steps after the window yet; ok: back to within the threshold;
# slower: over the threshold for more than the steps allowed; unknown: no steps to compare.
Verdict = Literal["pending", "ok", "slower", "unknown"]


class RankPostWindow(BaseModel):
    """One rank's steps after the window against its steps before it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    before_s: float | None = Field(default=None, description="Median step time before the window (s).")
    after_s: float | None = Field(default=None, description="Median step time after the window so far (s).")
    ratio: float | None = Field(default=None, description="after_s / before_s.")
    slow_steps: int = Field(default=0, description="Steps after the window that ran over the threshold, in a row.")
    verdict: Verdict = "pending"


class PostWindowCheck(BaseModel):
    """Every rank's check; ``verdict`` is the worst of them (slower > pending > unknown > ok)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(description="The slowdown that counts (RAYPROF_POST_WINDOW_SLOWDOWN).")
    steps: int = Field(description="Steps over the threshold after which a rank is reported (RAYPROF_POST_WINDOW_STEPS).")
    verdict: Verdict
    ranks: list[RankPostWindow] = Field(default_factory=list)
    detail: str = Field(description="The verdict in words.")

    @property
    def final(self) -> bool:
        return self.verdict != "pending"
