"""Pydantic models at every boundary: HTTP bodies, actor messages, the manifest on disk."""

from __future__ import annotations

import enum
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from orchestrator.merge_stats import MergeStats
from orchestrator.post_window import PostWindowCheck
from orchestrator.settings import (
    DEFAULT_STACKS_MAX_RANK_BYTES,
    MANIFEST_VERSION,
    MIN_STACKS_MAX_RANK_BYTES,
)

__all__ = [
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "IDEMPOTENCY_KEY_PATTERN",
    "NAME_MAX_LENGTH",
    "NAME_PATTERN",
    "Artifact",
    "ArtifactKey",
    "ArtifactKind",
    "BundleKind",
    "Command",
    "Heartbeat",
    "IdempotencyKey",
    "Manifest",
    "Name",
    "ProfileOptions",
    "PostprocessProgress",
    "ProfileRequest",
    "ProfileState",
    "ProfileStatus",
    "RankEvent",
    "RankResult",
    "RankState",
    "StorageSpec",
    "StrictModel",
    "TorchOptions",
    "Trigger",
    "WindowSpec",
    "WorkerInfo",
    "utcnow",
]


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the manifest uses."""
    return datetime.now(timezone.utc)


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._=-]*$"
NAME_MAX_LENGTH = 128
_KEY_MAX_LENGTH = 1024
# C0 controls, DEL and C1 controls: never part of a name, a key or a path.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _check_name(value: str) -> str:
    # Names become storage path components: refuse anything that could climb out.
    if ".." in value:
        raise ValueError("must not contain '..'")
    return value


def _check_key(value: str) -> str:
    # Keys are joined onto a storage root and onto a download folder: a relative
    # path of plain parts, nothing that climbs out or reaches the terminal.
    if value.startswith("/") or "\\" in value:
        raise ValueError("must be a relative path with '/' separators")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError("must not have empty, '.' or '..' parts")
    if _CONTROL_CHARS.search(value):
        raise ValueError("must not contain control characters")
    return value


Name = Annotated[
    str,
    Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN),
    AfterValidator(_check_name),
]
"""A target or profile id: letters, digits, '.', '_', '-', '='; no separators, no '..'."""

# Printable ASCII, no spaces: what an HTTP header carries unchanged.
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]+$"
IDEMPOTENCY_KEY_MAX_LENGTH = 255

IdempotencyKey = Annotated[
    str, Field(min_length=1, max_length=IDEMPOTENCY_KEY_MAX_LENGTH, pattern=IDEMPOTENCY_KEY_PATTERN)
]
"""A client's name for one submit (the ``Idempotency-Key`` header): a retry with it returns the first profile."""

ArtifactKey = Annotated[str, Field(min_length=1, max_length=_KEY_MAX_LENGTH), AfterValidator(_check_key)]
"""A storage key relative to a root or a profile folder: no absolute path, no '..', no control characters."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileState(str, enum.Enum):
    """Life of a profile request: PENDING -> SCHEDULED -> CAPTURING -> COLLECTING -> terminal."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    CAPTURING = "CAPTURING"
    COLLECTING = "COLLECTING"
    DONE = "DONE"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_PROFILE_STATES


_TERMINAL_PROFILE_STATES = frozenset(
    {ProfileState.DONE, ProfileState.PARTIAL, ProfileState.FAILED, ProfileState.CANCELLED}
)


class RankState(str, enum.Enum):
    """One rank's part in a profile."""

    WAITING = "WAITING"
    ARMED = "ARMED"
    CAPTURING = "CAPTURING"
    UPLOADING = "UPLOADING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (RankState.DONE, RankState.FAILED, RankState.CANCELLED)


class TorchOptions(StrictModel):
    """What ``torch.profiler.profile`` records; one field per argument of the same name."""

    activities: list[Literal["cpu", "cuda"]] | None = Field(
        default=None, description="Default: cpu, plus cuda where the worker has a GPU."
    )
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False


class ProfileOptions(TorchOptions):
    """A window's length and reach, plus what to record."""

    steps: int = Field(ge=1, description="Optimizer steps to record on every rank.")
    warmup: int = Field(default=0, ge=0, description="Profiler warmup steps before the window.")
    ranks: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, description="World ranks to profile; default all (an empty list is refused)."
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Give up on ranks that have not reported by then."
    )
    queue: bool = Field(
        default=False, description="Wait behind a running window instead of failing with 409."
    )

    def torch_options(self) -> TorchOptions:
        """The part of these options that ``torch.profiler.profile`` takes."""
        return TorchOptions(**{name: getattr(self, name) for name in TorchOptions.model_fields})


class ProfileRequest(ProfileOptions):
    """``POST /v1/profiles`` body and ``ProfilingClient.profile`` arguments."""

    target: Name
    run: Name | None = Field(
        default=None,
        description="The run's Ray job (submission id or job id) when two live runs share the target name; "
        "default the newest.",
    )


class StorageSpec(StrictModel):
    """Where artifacts go. Server configuration only, never taken from a request."""

    uri: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None


class WorkerInfo(StrictModel):
    """What an agent tells the controller about itself when it registers."""

    agent_id: str
    target: Name
    world_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    local_rank: int = Field(ge=0)
    node_rank: int = Field(ge=0)
    node_id: str
    host: str
    pid: int
    device: str
    ray_job_id: str | None = None
    submission_id: str | None = None
    experiment_path: str | None = None
    torch_version: str
    cuda_available: bool = False


class Heartbeat(StrictModel):
    """Sent with every long-poll: progress of this worker's training loop."""

    agent_id: str
    step: int = Field(ge=0)
    step_time_s: float | None = None


class WindowSpec(StrictModel):
    """One profiling window as an agent receives it."""

    profile_id: Name
    target: Name
    start_step: int = Field(ge=0)
    steps: int = Field(ge=1)
    warmup: int = Field(ge=0)
    options: TorchOptions
    storage: StorageSpec
    prefix: ArtifactKey
    max_trace_bytes: int

    @property
    def stop_step(self) -> int:
        """First step after the window."""
        return self.start_step + self.steps


class Command(StrictModel):
    """Controller -> agent, the answer to a long-poll.

    ``sync``: report your step count now. ``arm``: open ``window``.
    ``cancel``: drop the window of ``profile_id``. ``register``: the controller
    does not know you (it restarted); register again. ``stacks``: answer with
    every thread's stacks (bundle ``profile_id``), from the agent's own thread.
    """

    kind: Literal["sync", "arm", "cancel", "register", "stacks"]
    window: WindowSpec | None = None
    profile_id: Name | None = Field(default=None, description="The profile, or the stacks bundle of ``stacks``.")
    native: bool = Field(default=False, description="``stacks``: add native frames through py-spy.")
    max_bytes: int = Field(
        default=DEFAULT_STACKS_MAX_RANK_BYTES, ge=MIN_STACKS_MAX_RANK_BYTES, description="``stacks``: the answer's size limit."
    )


ArtifactKind = Literal[
    "trace",
    "memory_timeline",
    "op_table",
    "memory_snapshot",
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


class Trigger(StrictModel):
    """Why the controller took a profile or stacks by itself."""

    kind: Literal["slower_than", "rank_lag", "stalled"]
    watch_id: str | None = Field(default=None, description="The watch that fired; none for the stall detector.")
    baseline: float | None = Field(default=None, description="slower_than: baseline step time (s); rank_lag: 0.")
    observed: float | None = Field(default=None, description="Step time (s), steps behind, or seconds without progress.")
    threshold: float | None = None
    at: datetime
    detail: str = Field(description="The trigger in words.")


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


class PostprocessProgress(StrictModel):
    """Per-rank postprocessing done so far, e.g. "analysing 12/64 ranks"."""

    phase: Literal["analysing", "scanning", "merging"]
    done: int = Field(ge=0)
    total: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.phase} {self.done}/{self.total} ranks"


class ProfileStatus(StrictModel):
    """A profile request as the controller sees it now."""

    id: Name
    kind: BundleKind = "profile"
    target: Name
    run: str | None = Field(default=None, description="The Ray job of the run profiled, once scheduled.")
    state: ProfileState
    reason: str | None = None
    request: ProfileRequest
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


class Manifest(StrictModel):
    """``manifest.json``: the commit point of a profile, written last."""

    version: Literal[1] = MANIFEST_VERSION
    profile_id: Name
    kind: BundleKind = "profile"
    target: Name
    status: Literal[ProfileState.DONE, ProfileState.PARTIAL, ProfileState.FAILED, ProfileState.CANCELLED]
    reason: str | None = None
    request: ProfileRequest
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
    summary: dict[str, Any] | None = Field(default=None, description="orchestrator.analysis Summary.")
    analysis_error: str | None = None
    trigger: Trigger | None = Field(default=None, description="Set when a watch or the stall detector took it.")
    merge: MergeStats | None = Field(
        default=None, description="What the merged trace holds: its budget, what was dropped, each rank's clock alignment."
    )
    post_window: PostWindowCheck | None = Field(
        default=None, description="The post-window check as it stood when the manifest was written; the status has its end."
    )

    def all_artifacts(self) -> list[Artifact]:
        """Every file the manifest lists, rank artifacts first."""
        return [a for r in self.ranks for a in r.artifacts] + list(self.artifacts)
