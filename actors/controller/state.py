"""A profile request's life: what the controller knows about it, and which state may follow which.

::

    PENDING ──> SCHEDULED ──> CAPTURING ──> COLLECTING ──> DONE | PARTIAL | FAILED | CANCELLED
       │            │  └──────────────────────^   │
       └────────────┴─────────────────────────────┴──> (any terminal state)

A terminal state never changes again. ``Profile.transition`` is the only
way to change state, and it refuses any move the diagram does not draw.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from actors.controller.idempotency import SubmitKey
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
from orchestrator.models.requests import ProfileRequest, ProfileState

__all__ = ["ALLOWED", "Profile", "Window", "wait_event"]

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


@dataclass
class Profile:
    """One profile request as the controller holds it."""

    id: str
    # What was asked of a profile window; a stacks bundle asks for none (its target is given).
    request: ProfileRequest | None
    storage: StorageSpec
    # The profile's folder; made from the storage, the target and the id unless restored.
    storage_uri: str = ""
    target: str = ""
    run: str | None = None
    state: ProfileState = ProfileState.PENDING
    reason: str | None = None
    window: Window | None = None
    manifest_uri: str | None = None
    ranks: dict[int, RankResult] = field(default_factory=dict)
    agents: dict[int, str] = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested: bool = False
    deadline: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # The manifest once written: clients that wait get it without a storage read.
    manifest: Manifest | None = None
    kind: BundleKind = "profile"
    trigger: Trigger | None = None
    # Set while COLLECTING by the postprocess's per-rank tasks.
    postprocess: PostprocessProgress | None = None
    # The client's Idempotency-Key, when it gave one: a retried submit finds this profile.
    submit_key: SubmitKey | None = None
    # The post-window check, set by the controller's telemetry from the window's end.
    post_window: PostWindowCheck | None = None

    def __post_init__(self) -> None:
        if not self.target:
            if self.request is None:
                raise ValueError(f"{self.id}: a record without a request names its target")
            self.target = self.request.target
        if not self.storage_uri:
            self.storage_uri = profile_uri(self.storage.uri, self.target, self.id)

    @property
    def window_request(self) -> ProfileRequest:
        """What was asked of this profile's window; only the runner's profiles (never a bundle) have one."""
        if self.request is None:
            raise ValueError(f"{self.id} is a stacks bundle: it asks for no window")
        return self.request

    @property
    def start_step(self) -> int | None:
        return self.window.start_step if self.window else None

    @property
    def stop_step(self) -> int | None:
        return self.window.stop_step if self.window else None

    @property
    def requested_at(self) -> datetime:
        return self.created_at

    @property
    def profile_id(self) -> str:
        return self.id

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

    def snapshot(self) -> ProfileStatus:
        return ProfileStatus(**{name: getattr(self, name) for name in _STATUS_FIELDS}, ranks=self.sorted_ranks())

    def manifest_of(
        self,
        status: ProfileState,
        reason: str | None,
        cluster: dict[str, Any] | None = None,
        artifacts: list[Artifact] | None = None,
        summary: StacksSummary | None = None,
    ) -> Manifest:
        """The manifest of this profile once it has ended (``finished_at`` set): the one place a
        manifest is made from a record, for profiles (a draft the postprocess completes) and stacks alike."""
        return Manifest(
            **{name: getattr(self, name) for name in _MANIFEST_FIELDS},
            status=status,
            reason=reason,
            cluster=cluster or {},
            ranks=self.sorted_ranks(),
            artifacts=artifacts or [],
            summary=summary,
        )

    @classmethod
    def restore(
        cls,
        status: ProfileStatus,
        storage: StorageSpec,
        window_note: str | None,
        cancel_requested: bool,
        submit_key: SubmitKey | None = None,
    ) -> Profile:
        window = None
        if status.start_step is not None and status.stop_step is not None:
            window = Window(status.start_step, status.stop_step - status.start_step, window_note)
        return cls(
            **{name: getattr(status, name) for name in _RESTORED_FIELDS},
            storage=storage,
            window=window,
            ranks={r.rank: r for r in status.ranks},
            cancel_requested=cancel_requested,
            submit_key=submit_key,
        )


# Fields a Profile and the records made from it share by name (computed, so a field added to
# both is carried without another line). Ranks are a dict here and a sorted list there.
_STATUS_FIELDS = tuple(sorted(ProfileStatus.model_fields.keys() - {"ranks"}))
# Derived here (the window's steps) or not carried across a restart (postprocess progress:
# a restored COLLECTING profile runs its postprocess again).
_RESTORED_FIELDS = tuple(
    sorted(ProfileStatus.model_fields.keys() - {"ranks", "start_step", "stop_step", "postprocess"})
)
# What the manifest records that the profile holds; the rest is known only once it ends.
_MANIFEST_FIELDS = tuple(
    sorted(
        Manifest.model_fields.keys()
        - {"version", "status", "reason", "cluster", "ranks", "artifacts", "summary", "analysis_error", "merge"}
    )
)
