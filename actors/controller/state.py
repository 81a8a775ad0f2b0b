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

from actors.controller.idempotency import SubmitKey
from orchestrator.errors import IllegalTransitionError
from orchestrator.layout import profile_prefix
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import BundleKind, Manifest, PostprocessProgress, ProfileStatus, RankResult, Trigger
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
    request: ProfileRequest
    storage: StorageSpec
    storage_uri: str
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

    @property
    def target(self) -> str:
        return self.request.target

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
        return ProfileStatus(
            id=self.id,
            kind=self.kind,
            trigger=self.trigger,
            target=self.target,
            run=self.run,
            state=self.state,
            reason=self.reason,
            request=self.request,
            start_step=self.window.start_step if self.window else None,
            stop_step=self.window.stop_step if self.window else None,
            storage_uri=self.storage_uri,
            manifest_uri=self.manifest_uri,
            ranks=[self.ranks[r] for r in sorted(self.ranks)],
            created_at=self.created_at,
            scheduled_at=self.scheduled_at,
            capture_started_at=self.capture_started_at,
            finished_at=self.finished_at,
            postprocess=self.postprocess,
            post_window=self.post_window,
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
            id=status.id,
            request=status.request,
            storage=storage,
            storage_uri=status.storage_uri,
            run=status.run,
            state=status.state,
            reason=status.reason,
            window=window,
            manifest_uri=status.manifest_uri,
            ranks={r.rank: r for r in status.ranks},
            created_at=status.created_at,
            scheduled_at=status.scheduled_at,
            capture_started_at=status.capture_started_at,
            finished_at=status.finished_at,
            cancel_requested=cancel_requested,
            kind=status.kind,
            trigger=status.trigger,
            submit_key=submit_key,
            post_window=status.post_window,
        )
