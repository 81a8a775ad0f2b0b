"""What agents, their node's relay and the controller say to each other: registration, heartbeats,
windows, commands (one model per kind, told apart by ``kind``), and a relay's node poll.

Every message here crosses a Ray call pickled (agents and the controller ship together, so both
ends have the same classes); a list of commands is validated as the :data:`Command` union.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator

from orchestrator.layout import normalize_uri
from orchestrator.models.common import ArtifactKey, Name, StrictModel
from orchestrator.models.requests import TorchOptions
from orchestrator.settings import DEFAULT_STACKS_MAX_RANK_BYTES, MIN_STACKS_MAX_RANK_BYTES


class StorageSpec(StrictModel):
    """Where artifacts go. Server configuration only, never taken from a request."""

    uri: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None

    # The one place a storage root is normalized: every spec holds its root's one form.
    _normal_uri = field_validator("uri")(normalize_uri)


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
    build: str | None = Field(
        default=None, description="The rayprof build the agent runs (orchestrator.build); None: a release before build ids."
    )
    actor_id: str | None = Field(
        default=None,
        description="The Ray actor the worker runs in (hex): when the worker goes silent the controller asks Ray "
        "whether, and why, it ended. None: a release before this field, or no actor.",
    )


class Heartbeat(StrictModel):
    """Sent with every long-poll: progress of this worker's training loop."""

    agent_id: str
    step: int = Field(ge=0)
    step_time_s: float | None = None
    step_definition: str | None = Field(
        default=None,
        description="What one step is, e.g. '1 step = Adam.step ×1 + SGD.step ×1; 4 forward passes (Discriminator ×3, "
        "Generator ×1)' (the agent's step cycle, and the forward passes it counted while it learned the cycle).",
    )


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


class SnapshotDestination(StrictModel):
    """Where a rank puts its CUDA allocator snapshot when a ``stacks`` command asks for it."""

    storage: StorageSpec
    prefix: ArtifactKey


class OomReport(StrictModel):
    """Agent -> controller, at once: this rank's CUDA allocator could not satisfy an allocation.

    Sent by a rank whose history is being recorded for an OOM watch; the rank has kept its
    snapshot, taken before the exception reached the job."""

    agent_id: str
    device: int
    asked_bytes: int = Field(ge=0)
    limit_bytes: int = Field(
        ge=0, description="The device's memory, or the share of it the process may use (set_per_process_memory_fraction)."
    )
    free_bytes: int = Field(ge=0, description="What the device had free.")
    at: datetime


class SyncCommand(StrictModel):
    """Report your step count now (a sync round): nothing to do but the next poll."""

    kind: Literal["sync"] = "sync"


class ArmCommand(StrictModel):
    """Open ``window``."""

    kind: Literal["arm"] = "arm"
    window: WindowSpec


class CancelCommand(StrictModel):
    """Drop the window of ``profile_id``."""

    kind: Literal["cancel"] = "cancel"
    profile_id: Name


class RegisterCommand(StrictModel):
    """The controller (or relay) does not know you (it restarted): register again."""

    kind: Literal["register"] = "register"


class StacksCommand(StrictModel):
    """Answer with every thread's stacks for bundle ``profile_id``, taken from the agent's own thread,
    and with ``memory`` the CUDA allocator's snapshot stored there."""

    kind: Literal["stacks"] = "stacks"
    profile_id: Name = Field(description="The stacks bundle.")
    native: bool = Field(default=False, description="Add native frames through py-spy.")
    max_bytes: int = Field(
        default=DEFAULT_STACKS_MAX_RANK_BYTES, ge=MIN_STACKS_MAX_RANK_BYTES, description="The answer's size limit."
    )
    memory: SnapshotDestination | None = Field(default=None, description="Store the rank's CUDA allocator snapshot here too.")


class MemoryHistoryCommand(StrictModel):
    """Record the CUDA allocator's history and report an out-of-memory error at once (``record``),
    or stop (an OOM watch's life)."""

    kind: Literal["memory_history"] = "memory_history"
    record: bool


Command = Annotated[
    SyncCommand | ArmCommand | CancelCommand | RegisterCommand | StacksCommand | MemoryHistoryCommand,
    Field(discriminator="kind"),
]
"""Controller (or relay) -> agent, the answer to a long-poll: one of the command models, by ``kind``."""


class NodeBeat(StrictModel):
    """One local rank's latest heartbeat, as a relay forwards it."""

    heartbeat: Heartbeat
    age_s: float = Field(ge=0, description="Seconds between the rank's poll and this forward: the controller dates it back.")


class NodePoll(StrictModel):
    """A relay's long-poll on behalf of every rank on its node."""

    relay_id: str
    beats: list[NodeBeat]


class NodeReply(StrictModel):
    """Commands for the relay's ranks, by agent id, oldest first."""

    commands: dict[str, list[Command]] = Field(default_factory=dict)
