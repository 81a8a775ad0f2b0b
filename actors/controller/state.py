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
from orchestrator.config import normalize_uri
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
            self.storage_uri = profile_uri(normalize_uri(self.storage.uri), self.target, self.id)

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
        """The status clients read: the record now, its ranks in order, its window as steps."""
        return ProfileStatus(
            id=self.id,
            kind=self.kind,
            target=self.target,
            run=self.run,
            state=self.state,
            reason=self.reason,
            request=self.request,
            start_step=self.start_step,
            stop_step=self.stop_step,
            storage_uri=self.storage_uri,
            manifest_uri=self.manifest_uri,
            ranks=self.sorted_ranks(),
            created_at=self.created_at,
            scheduled_at=self.scheduled_at,
            capture_started_at=self.capture_started_at,
            finished_at=self.finished_at,
            trigger=self.trigger,
            postprocess=self.postprocess,
            post_window=self.post_window,
        )

    def summary(self) -> ProfileSummary:
        """The record as lists show it: per-state rank counts instead of the ranks."""
        counts: dict[RankState, int] = {}
        for rank in self.sorted_ranks():
            counts[rank.state] = counts.get(rank.state, 0) + 1
        return ProfileSummary(
            id=self.id,
            kind=self.kind,
            target=self.target,
            run=self.run,
            state=self.state,
            reason=self.reason,
            steps=self.request.steps if self.request is not None else None,
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
        """The manifest of this profile once it has ended (``finished_at`` set): the one place a
        manifest is made from a record, for profiles (a draft the postprocess completes) and stacks alike."""
        if self.finished_at is None:
            raise ValueError(f"{self.id} has not ended: it has no manifest yet")
        return Manifest(
            profile_id=self.id,
            kind=self.kind,
            target=self.target,
            status=status,
            reason=reason,
            request=self.request,
            storage_uri=self.storage_uri,
            start_step=self.start_step,
            stop_step=self.stop_step,
            cluster=cluster or {},
            ranks=self.sorted_ranks(),
            artifacts=artifacts or [],
            requested_at=self.created_at,
            scheduled_at=self.scheduled_at,
            capture_started_at=self.capture_started_at,
            finished_at=self.finished_at,
            summary=summary,
            trigger=self.trigger,
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
        """The record a saved status was made from; the postprocess's progress is not carried over
        a restart (a restored COLLECTING profile runs its postprocess again)."""
        window = None
        if status.start_step is not None and status.stop_step is not None:
            window = Window(status.start_step, status.stop_step - status.start_step, window_note)
        return cls(
            id=status.id,
            kind=status.kind,
            request=status.request,
            storage=storage,
            storage_uri=status.storage_uri,
            target=status.target,
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
            trigger=status.trigger,
            submit_key=submit_key,
            post_window=status.post_window,
        )

