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
    shift_us: float  # added to the rank's own timestamps
    matched: int = 0  # collectives matched with the reference rank
    residual_us: float | None = None  # median |end - reference end| after the shift
    max_residual_us: float | None = None


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
