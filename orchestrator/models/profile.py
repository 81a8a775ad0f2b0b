"""A profile as the API returns it and as its manifest records it: artifacts, rank results, status."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.models.analysis import Summary
from orchestrator.models.common import ArtifactKey, Name, StrictModel
from orchestrator.models.merge_stats import MergeStats
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.settings import MANIFEST_VERSION

ArtifactKind = Literal[
    "trace",
    "memory_timeline",
    "memory_snapshot",
    "memory_view",
    "op_table",
    "merged_trace",
    "report",
    "manifest",
    "stacks",
    "stacks_summary",
    "flight_recorder",
]

BundleKind = Literal["profile", "stacks"]
"""What a profile folder holds: a profiler window's traces, or every rank's stacks."""


class Artifact(StrictModel):
    """A file in storage, fully written before it is listed."""

    kind: ArtifactKind
    key: ArtifactKey = Field(description="Path relative to the profile folder.")
    uri: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


_MISSED_START_DOC = "The arm reached this rank after the window's first step had passed there."
_EVENT_AT_DOC = "When the agent made this event, by its clock: the rank's armed/capturing/finished times."


class RankEvent(StrictModel):
    """Agent -> controller: a rank's window changed state."""

    profile_id: Name
    agent_id: str
    state: RankState
    first_step: int | None = None
    last_step: int | None = None
    step_durations_ms: list[float] = Field(default_factory=list)
    base_time_ns: int | None = None
    trace_bytes: int | None = Field(default=None, ge=0, description="The whole window's raw trace, before any cut.")
    artifacts: list[Artifact] = Field(default_factory=list)
    reason: str | None = None
    missed_start: bool = Field(default=False, description=_MISSED_START_DOC)
    at: datetime | None = Field(default=None, description=_EVENT_AT_DOC)

    def outcome(self) -> dict[str, Any]:
        """What a rank's final event adds to its :class:`RankResult` (every field the two share
        but state and reason, which every event sets): a field added to both is carried here."""
        return {name: getattr(self, name) for name in _OUTCOME_FIELDS}


class OutOfMemory(StrictModel):
    """The out-of-memory error an ``oom`` watch fired on."""

    rank: int
    device: int
    asked_bytes: int
    limit_bytes: int = Field(description="The device's memory, or the share of it the process is allowed.")
    free_bytes: int


class Trigger(StrictModel):
    """Why the controller took a profile or stacks by itself."""

    kind: Literal["slower_than", "rank_lag", "stalled", "schedule", "oom"]
    watch_id: str | None = Field(default=None, description="The watch that fired; none for the stall detector.")
    baseline: float | None = Field(default=None, description="slower_than: baseline step time (s); rank_lag: 0.")
    observed: float | None = Field(default=None, description="Step time (s), steps behind, or seconds without progress.")
    threshold: float | None = Field(default=None, description="The limit observed passed; schedule: the period (s).")
    at: datetime
    detail: str = Field(description="The trigger in words.")
    oom: OutOfMemory | None = Field(default=None, description="oom: the failing rank, what it asked for, what was free.")


class RankResult(StrictModel):
    """One rank in a profile: who it is, what it captured, what it uploaded."""

    rank: int
    local_rank: int | None = None
    node_id: str | None = None
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    state: RankState
    reason: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    step_durations_ms: list[float] = Field(default_factory=list)
    step_definition: str | None = Field(
        default=None,
        description="What one step is on this rank, e.g. '1 step = Adam.step ×1 + SGD.step ×1; 4 forward passes "
        "(Discriminator ×3, Generator ×1)'.",
    )
    base_time_ns: int | None = None
    trace_bytes: int | None = Field(default=None, ge=0, description="The whole window's raw trace, before any cut.")
    artifacts: list[Artifact] = Field(default_factory=list)
    armed_at: datetime | None = None
    capture_started_at: datetime | None = None
    capture_ended_at: datetime | None = None
    finished_at: datetime | None = None
    missed_start: bool = Field(default=False, description=_MISSED_START_DOC)

    @property
    def bytes_uploaded(self) -> int:
        return sum(a.bytes for a in self.artifacts)

    @classmethod
    def waiting(cls, info: WorkerInfo, step_definition: str | None = None) -> RankResult:
        """A selected rank before it armed: who it is, from what its agent registered, and what one step is."""
        shared = {name: getattr(info, name) for name in _WORKER_FIELDS}
        return cls(rank=info.world_rank, state=RankState.WAITING, step_definition=step_definition, **shared)


_WORKER_FIELDS = tuple(sorted(WorkerInfo.model_fields.keys() & RankResult.model_fields.keys()))
_OUTCOME_FIELDS = tuple(sorted((RankEvent.model_fields.keys() & RankResult.model_fields.keys()) - {"state", "reason"}))


class PostprocessProgress(StrictModel):
    """Per-rank postprocessing done so far, e.g. "analysing 12/64 ranks"."""

    phase: Literal["analysing", "scanning", "merging"]
    done: int = Field(ge=0)
    total: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.phase} {self.done}/{self.total} ranks"


def _bundle_asks_nothing(data: Any) -> Any:
    # Stacks bundles saved or written before they became their own kind carry an invented
    # one-step request; folders and saved state are kept for weeks, so it is dropped on load.
    if isinstance(data, dict) and data.get("kind") == "stacks" and data.get("request") is not None:
        return {**data, "request": None}
    return data


def _request_of_its_kind(kind: str, request: ProfileRequest | None) -> None:
    if (kind == "profile") != (request is not None):
        raise ValueError("a profile has a request and a stacks bundle has none")


class ProfileStatus(StrictModel):
    """A profile request as the controller sees it now."""

    id: Name
    kind: BundleKind = "profile"
    target: Name
    run: str | None = Field(default=None, description="The Ray job of the run profiled, once scheduled.")
    state: ProfileState
    reason: str | None = None
    request: ProfileRequest | None = Field(default=None, description="What was asked: a profile's window; none for a stacks bundle.")
    start_step: int | None = None
    stop_step: int | None = Field(
        default=None, description="First step after the window; start_step + steps unless the byte cap shortened it."
    )
    storage_uri: str
    manifest_uri: str | None = None
    ranks: list[RankResult] = Field(default_factory=list)
    created_at: datetime
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    finished_at: datetime | None = None
    trigger: Trigger | None = Field(default=None, description="Set when a watch or the stall detector took it.")
    postprocess: PostprocessProgress | None = Field(
        default=None, description="While COLLECTING: how far the per-rank analysis and merge have got."
    )
    post_window: PostWindowCheck | None = Field(default=None, description="Steps after the window against steps before it.")

    @model_validator(mode="before")
    @classmethod
    def _old_bundle(cls, data: Any) -> Any:
        return _bundle_asks_nothing(data)

    @model_validator(mode="after")
    def _request_of_kind(self) -> ProfileStatus:
        _request_of_its_kind(self.kind, self.request)
        return self


class StacksSummary(StrictModel):
    """A stacks bundle's manifest summary: its one line, and how the ranks fell out."""

    kind: Literal["stacks"] = "stacks"
    line: str = Field(description="One line: ranks that differ from the majority first.")
    groups: int | None = Field(default=None, ge=0, description="Groups of ranks with the same stacks (unknown in old manifests).")
    missing: list[int] = Field(default_factory=list, description="Ranks that gave no usable answer.")


class Manifest(StrictModel):
    """``manifest.json``: the commit point of a profile, written last."""

    version: Literal[1] = MANIFEST_VERSION
    profile_id: Name
    kind: BundleKind = "profile"
    target: Name
    status: Literal[ProfileState.DONE, ProfileState.PARTIAL, ProfileState.FAILED, ProfileState.CANCELLED]
    reason: str | None = None
    request: ProfileRequest | None = Field(default=None, description="What was asked: a profile's window; none for a stacks bundle.")
    storage_uri: str = Field(description="Folder that holds this profile.")
    start_step: int | None
    stop_step: int | None
    cluster: dict[str, Any] = Field(default_factory=dict)
    ranks: list[RankResult]
    artifacts: list[Artifact] = Field(default_factory=list, description="Profile-level files.")
    requested_at: datetime
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    finished_at: datetime
    summary: Summary | StacksSummary | None = Field(
        default=None, description="A profile's analysis summary, or a stacks bundle's summary: by ``kind``."
    )
    analysis_error: str | None = None
    trigger: Trigger | None = Field(default=None, description="Set when a watch or the stall detector took it.")
    merge: MergeStats | None = Field(
        default=None, description="What the merged trace holds: its budget, what was dropped, each rank's clock alignment."
    )
    post_window: PostWindowCheck | None = Field(
        default=None, description="The post-window check as it stood when the manifest was written; the status has its end."
    )

    @model_validator(mode="before")
    @classmethod
    def _old_stacks_summary(cls, data: Any) -> Any:
        data = _bundle_asks_nothing(data)
        # Manifests of stacks bundles written before StacksSummary hold {"stacks": line}; folders are kept for weeks.
        if isinstance(data, dict) and data.get("kind") == "stacks" and isinstance(data.get("summary"), dict):
            old = data["summary"]
            if old.keys() == {"stacks"}:
                return {**data, "summary": {"line": old["stacks"]}}
        return data

    @model_validator(mode="after")
    def _summary_of_its_kind(self) -> Manifest:
        _request_of_its_kind(self.kind, self.request)
        expected = StacksSummary if self.kind == "stacks" else Summary
        if self.summary is not None and not isinstance(self.summary, expected):
            raise ValueError(f"a manifest of kind {self.kind!r} holds a {expected.__name__} summary")
        return self

    def all_artifacts(self) -> list[Artifact]:
        """Every file the manifest lists, rank artifacts first."""
        return [a for r in self.ranks for a in r.artifacts] + list(self.artifacts)
