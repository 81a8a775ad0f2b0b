"""What a merge of rank traces did, as the manifest records it (no trace code: the agent loads this).

:class:`MergeStats` is written by :func:`orchestrator.traces.merge.merge_traces`
and carried in the manifest's ``merge`` and the merged trace's ``rayprof``
metadata: the byte budget, what was dropped to meet it, each rank's clock
shift and residual alignment error, and the ranks skipped or cut short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator import settings

__all__ = ["DroppedEvents", "MergeStats", "RankAlignment", "RejectedTrace"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RejectedTrace(_Model):
    """A file that could not stand for a rank, and why."""

    path: Path
    rank: int | None = None
    reason: str


class RankAlignment(_Model):
    """How one rank's clock was put on the merged trace's."""

    rank: int
    method: Literal["collectives", "base time"]
    # merged time = ts + shift_us + drift_ppm * 1e-6 * (ts - pivot_us), ts being the rank's own timestamps
    shift_us: float
    drift_ppm: float = 0.0
    pivot_us: float = 0.0
    reference: int | None = None  # the rank whose collectives this one was fitted to (None: placed by its wall clock)
    matched: int = 0  # collectives matched with the reference rank
    # An upper bound of the alignment error against the reference's clock: the largest residual after the fit,
    # plus the timestamps' resolution, plus the reference's own bound (0 for the rank that defines the clock).
    residual_us: float | None = None
    max_residual_us: float | None = None  # the largest |end - reference end| left after the fit

    def merged_us(self, ts: float) -> float:
        """The rank's own timestamp ``ts`` on the merged clock."""
        return ts + self.shift_us + self.drift_ppm * 1e-6 * (ts - self.pivot_us)


class DroppedEvents(_Model):
    """What a merge over budget left out."""

    events: int
    by_kind: dict[str, int]
    min_span_us: float | None = None  # ops and kernels shorter than this were dropped
    min_comm_us: float | None = None  # collectives and copies shorter than this were dropped
    reason: str


class MergeStats(_Model):
    """What a merge read and wrote; the manifest carries it as ``merge``."""

    ranks: list[int]
    events: int
    input_bytes: int
    output_bytes: int
    seconds: float
    skipped: list[RejectedTrace] = []
    truncated: list[RejectedTrace] = []
    input_raw_bytes: int = 0
    output_raw_bytes: int = 0
    max_bytes: int = settings.DEFAULT_MAX_MERGED_BYTES
    dropped: DroppedEvents | None = None
    alignment: list[RankAlignment] = []
    # Set where some ranks share no collectives with the first: they are placed on wall clocks only, and how far apart those can be.
    alignment_note: str | None = None
