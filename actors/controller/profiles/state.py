"""A profile request's life: what the controller knows about it, and which state may follow which.

::

    PENDING ──> SCHEDULED ──> CAPTURING ──> COLLECTING ──> DONE | PARTIAL | FAILED | CANCELLED
       │            │  └──────────────────────^   │
       └────────────┴─────────────────────────────┴──> (any terminal state)

A terminal state never changes again. ``transition`` is the only way to
change state, and it refuses any move the diagram does not draw.

Two kinds of record live this life: a :class:`Profile` (a profiler window
asked for by its request) and a :class:`StacksRecord` (every rank's stacks,
PENDING straight to its end). Each is saved as it is; what clients read of
it (status, list item, manifest) is computed from it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from actors.controller.profiles.idempotency import SubmitKey
from orchestrator.errors import IllegalTransitionError
from orchestrator.layout import profile_prefix, profile_uri
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import (
    Artifact,
    BundleKind,
    Manifest,
    PostprocessProgress,
    ProfileStatus,
    RankResult,
    StacksSummary,
    Trigger,
)
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.models.summaries import ProfileSummary

__all__ = ["ALLOWED", "Profile", "Record", "StacksRecord", "Window", "load_record", "wait_event"]

_TERMINAL = frozenset(s for s in ProfileState if s.is_terminal)

ALLOWED: dict[ProfileState, frozenset[ProfileState]] = {
    ProfileState.PENDING: _TERMINAL | {ProfileState.SCHEDULED},
    ProfileState.SCHEDULED: _TERMINAL | {ProfileState.CAPTURING, ProfileState.COLLECTING},
    ProfileState.CAPTURING: _TERMINAL | {ProfileState.COLLECTING},
    ProfileState.COLLECTING: _TERMINAL,
    **{s: frozenset() for s in _TERMINAL},
}


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``event`` is set or ``timeout_s`` passes.

    ``asyncio.wait`` rather than ``wait_for``: on Python 3.10 and 3.11
    ``wait_for`` can swallow a cancellation that races the event, leaving a task
    that never ends; ``asyncio.wait`` never swallows one, and it is there on 3.10
    (``asyncio.timeout`` is 3.11's).
    """
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()


@dataclass(frozen=True)
class Window:
    """The steps ``[start_step, start_step + steps)`` every selected rank records.

    ``note`` says why the window is shorter than asked, when the byte cap made it so.
    """

    start_step: int
    steps: int
    note: str | None = None

    @property
    def stop_step(self) -> int:
        """First step after the window."""
        return self.start_step + self.steps


class _Record(BaseModel):
    """What a profile and a stacks bundle both are: a folder of one target, ranks, a state.

    The saved state file is the record's own JSON: the fields marked ``exclude`` live only
    while it runs. Status, list summary and manifest are views computed from it
    (:meth:`snapshot`, :meth:`summary`, :meth:`manifest_of`).
    """

    # Not validated on assignment: the runner changes a record thousands of times a window.
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    id: str
    storage: StorageSpec
    # The folder; made from the storage, the target and the id unless restored.
    storage_uri: str = ""
    target: str = ""
    run: str | None = None
    state: ProfileState = ProfileState.PENDING
    reason: str | None = None
    manifest_uri: str | None = None
    ranks: dict[int, RankResult] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    trigger: Trigger | None = None
    changed: asyncio.Event = Field(default_factory=asyncio.Event, exclude=True)
    # The manifest once written: clients that wait get it without a storage read.
    manifest: Manifest | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _placed(self) -> _Record:
        if not self.target:
            raise ValueError(f"{self.id}: a record names its target")
        if not self.storage_uri:
            self.storage_uri = profile_uri(self.storage.uri, self.target, self.id)
        return self

    def sorted_ranks(self) -> list[RankResult]:
        return [self.ranks[r] for r in sorted(self.ranks)]

    @property
    def prefix(self) -> str:
        return profile_prefix(self.target, self.id)

    def transition(self, state: ProfileState) -> ProfileState:
        """Move to ``state``; returns the state it left. Raises on a move the diagram does not allow."""
        if state not in ALLOWED[self.state]:
            raise IllegalTransitionError(
                f"profile {self.id} cannot go from {self.state.value} to {state.value}", profile_id=self.id
            )
        previous, self.state = self.state, state
        self.changed.set()
        return previous

    def _asked(self) -> _Asked:
        raise NotImplementedError

    def snapshot(self) -> ProfileStatus:
        """The status clients read: the record now, its ranks in order, its window as steps."""
        asked = self._asked()
        return ProfileStatus(
            id=self.id,
            kind=asked.kind,
            target=self.target,
            run=self.run,
            state=self.state,
            reason=self.reason,
            request=asked.request,
            start_step=asked.start_step,
            stop_step=asked.stop_step,
            storage_uri=self.storage_uri,
            manifest_uri=self.manifest_uri,
            ranks=self.sorted_ranks(),
            created_at=self.created_at,
            scheduled_at=asked.scheduled_at,
            capture_started_at=asked.capture_started_at,
            finished_at=self.finished_at,
            trigger=self.trigger,
            postprocess=asked.postprocess,
            post_window=asked.post_window,
        )

    def summary(self) -> ProfileSummary:
        """The record as lists show it: per-state rank counts instead of the ranks."""
        counts: dict[RankState, int] = {}
        for rank in self.sorted_ranks():
            counts[rank.state] = counts.get(rank.state, 0) + 1
        asked = self._asked()
        return ProfileSummary(
            id=self.id,
            kind=asked.kind,
            target=self.target,
            run=self.run,
            state=self.state,
            reason=self.reason,
            steps=asked.request.steps if asked.request is not None else None,
            rank_states=counts,
            storage_uri=self.storage_uri,
            manifest_uri=self.manifest_uri,
            created_at=self.created_at,
            finished_at=self.finished_at,
            trigger=self.trigger,
        )

    def manifest_of(
        self,
        status: ProfileState,
        reason: str | None,
        cluster: dict[str, Any] | None = None,
        artifacts: list[Artifact] | None = None,
        summary: StacksSummary | None = None,
    ) -> Manifest:
        """The manifest of this record once it has ended (``finished_at`` set): the one place a
        manifest is made from a record, for profiles (a draft the postprocess completes) and stacks alike."""
        if self.finished_at is None:
            raise ValueError(f"{self.id} has not ended: it has no manifest yet")
        asked = self._asked()
        return Manifest(
            profile_id=self.id,
            kind=asked.kind,
            target=self.target,
            status=status,
            reason=reason,
            request=asked.request,
            storage_uri=self.storage_uri,
            start_step=asked.start_step,
            stop_step=asked.stop_step,
            cluster=cluster or {},
            ranks=self.sorted_ranks(),
            artifacts=artifacts or [],
            requested_at=self.created_at,
            scheduled_at=asked.scheduled_at,
            capture_started_at=asked.capture_started_at,
            finished_at=self.finished_at,
            summary=summary,
            trigger=self.trigger,
            post_window=asked.post_window,
        )


@dataclass(frozen=True)
class _Asked:
    """What the views of a record show of its window: a profile's, or a bundle's (none)."""

    kind: BundleKind
    request: ProfileRequest | None = None
    start_step: int | None = None
    stop_step: int | None = None
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    postprocess: PostprocessProgress | None = None
    post_window: PostWindowCheck | None = None


class Profile(_Record):
    """A profiler window on a target's ranks, from its request to a terminal state."""

    kind: Literal["profile"] = "profile"
    request: ProfileRequest
    window: Window | None = None
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    cancel_requested: bool = False
    # The client's Idempotency-Key, when it gave one: a retried submit finds this profile.
    submit_key: SubmitKey | None = None
    # The post-window check, set by the controller's telemetry from the window's end.
    post_window: PostWindowCheck | None = None
    # Rank -> the agent that holds it in this run.
    agents: dict[int, str] = Field(default_factory=dict, exclude=True)
    deadline: float | None = Field(default=None, exclude=True)
    # Set while COLLECTING by the postprocess's per-rank tasks.
    postprocess: PostprocessProgress | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _target_of_request(cls, data: Any) -> Any:
        # A profile's target is its request's; given apart only by a record read back.
        if isinstance(data, dict) and not data.get("target") and data.get("request") is not None:
            request = data["request"]
            target = request.target if isinstance(request, ProfileRequest) else request.get("target")
            return {**data, "target": target}
        return data

    @property
    def start_step(self) -> int | None:
        return self.window.start_step if self.window else None

    @property
    def stop_step(self) -> int | None:
        return self.window.stop_step if self.window else None

    def _asked(self) -> _Asked:
        return _Asked(
            kind=self.kind,
            request=self.request,
            start_step=self.start_step,
            stop_step=self.stop_step,
            scheduled_at=self.scheduled_at,
            capture_started_at=self.capture_started_at,
            postprocess=self.postprocess,
            post_window=self.post_window,
        )


class StacksRecord(_Record):
    """A stacks bundle: every rank's stacks, taken at once; it asks for no window."""

    kind: Literal["stacks"] = "stacks"

    def _asked(self) -> _Asked:
        return _Asked(kind=self.kind)


Record = Annotated[Profile | StacksRecord, Field(discriminator="kind")]
"""Whatever the controller holds and saves: a profile or a stacks bundle."""

_RECORD: TypeAdapter[Profile | StacksRecord] = TypeAdapter(Record)


def load_record(data: bytes) -> Profile | StacksRecord:
    """A saved state file, in today's format or the one before. Raises ``ValueError`` when unreadable."""
    saved = json.loads(data)
    if isinstance(saved, dict) and "status" in saved:
        saved = _record_of_v1(saved)
    return _RECORD.validate_python(saved)


def _record_of_v1(saved: dict[str, Any]) -> dict[str, Any]:
    """A state file saved before the record was saved as it is: ``{"status", "storage",
    "window_note", "cancel_requested", "submit_key"}``. Kept for the files of controllers
    upgraded in place; the postprocess's progress is dropped (a restored profile runs it again)."""
    status = ProfileStatus.model_validate(saved["status"])
    window = None
    if status.start_step is not None and status.stop_step is not None:
        window = Window(status.start_step, status.stop_step - status.start_step, saved.get("window_note"))
    common = {
        "id": status.id,
        "kind": status.kind,
        "storage": saved["storage"],
        "storage_uri": status.storage_uri,
        "target": status.target,
        "run": status.run,
        "state": status.state,
        "reason": status.reason,
        "manifest_uri": status.manifest_uri,
        "ranks": {r.rank: r for r in status.ranks},
        "created_at": status.created_at,
        "finished_at": status.finished_at,
        "trigger": status.trigger,
    }
    if status.kind == "stacks":
        return common
    return {
        **common,
        "request": status.request,
        "window": window,
        "scheduled_at": status.scheduled_at,
        "capture_started_at": status.capture_started_at,
        "cancel_requested": saved.get("cancel_requested", False),
        "submit_key": saved.get("submit_key"),
        "post_window": status.post_window,
    }
