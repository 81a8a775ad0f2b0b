"""What lists show: a profile in brief, a page of them, and what ``rayprof gc`` removed.

A list item is a summary, not the full record: with 64 ranks a full
``ProfileStatus`` is ~33 KB, a summary ~0.6 KB. A profile's own page fetches
the full record (``GET /v1/profiles/{id}``).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from orchestrator.models.common import Name, StrictModel
from orchestrator.models.profile import BundleKind, Trigger
from orchestrator.models.requests import ProfileState, RankState
from orchestrator.settings import MAX_GC_GRACE_HOURS

__all__ = ["GcReport", "GcRequest", "Leftover", "ProfilePage", "ProfileSummary"]


class ProfileSummary(StrictModel):
    """One profile as lists show it: its state and per-state rank counts, no per-rank records."""

    id: Name
    kind: BundleKind = "profile"
    target: Name
    run: str | None = None
    state: ProfileState
    reason: str | None = None
    steps: int | None = Field(default=None, ge=1, description="Steps asked for; none for a stacks bundle.")
    rank_states: dict[RankState, int] = Field(default_factory=dict, description="How many ranks are in each state.")
    storage_uri: str
    manifest_uri: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    trigger: Trigger | None = None


class ProfilePage(StrictModel):
    """One page of profiles, newest first."""

    profiles: list[ProfileSummary]
    total: int = Field(ge=0, description="Profiles that match, on every page.")
    offset: int = Field(ge=0)
    limit: int = Field(ge=1)


class GcRequest(StrictModel):
    """``POST /v1/gc``: apply retention now and remove leftovers; ``dry_run`` only says what would go."""

    dry_run: bool = False
    grace_hours: float | None = Field(
        default=None,
        gt=0,
        le=MAX_GC_GRACE_HOURS,
        description="Leftover folders younger than this are kept (default RAYPROF_GC_GRACE_HOURS).",
    )


class Leftover(StrictModel):
    """A profile folder with no manifest and no saved state: a crashed postprocess's remains."""

    target: Name
    profile_id: Name
    uri: str
    created_at: datetime


class GcReport(StrictModel):
    """What ``gc`` deleted, or with ``dry_run`` would delete."""

    dry_run: bool
    expired: list[ProfileSummary] = Field(description="Finished profiles past the retention policy.")
    leftovers: list[Leftover]
    failed: list[str] = Field(default_factory=list, description="What could not be deleted, and why.")
    skipped: list[str] = Field(
        default_factory=list, description="Folders kept only because their owner lease cannot be read, and why."
    )
