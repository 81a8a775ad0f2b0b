"""One window per target at a time: who runs, who waits their turn, and who is refused.

A target's profiles run one after another, in the order they were accepted.
A submit finds the target busy (a window running, or others waiting) and
is refused with a conflict unless it asked to ``queue``, and a queue is
bounded (``max_queued_per_target``). A profile that has ended (or was deleted)
but not yet released its slot is not in the way. Everything here is synchronous except
:meth:`TargetQueue.run`, so a second submit sees the first one's place at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from actors.controller.profiles.state import Profile
from orchestrator.errors import ConflictError
from orchestrator.models.control import ControllerConfig
from orchestrator.models.requests import ProfileRequest

__all__ = ["TargetQueue"]


class TargetQueue:
    def __init__(self, profiles: dict[str, Profile], config: Callable[[], ControllerConfig]) -> None:
        # The unfinished profiles, by id (the catalog's live dict): what the ids here refer to.
        self._profiles = profiles
        self._config = config
        self._slots: dict[str, asyncio.Lock] = {}
        self.waiting: dict[str, list[str]] = {}
        self.active: dict[str, str] = {}

    def admit(self, request: ProfileRequest) -> None:
        """Raise :class:`ConflictError` when ``request`` may not join its target's line now."""
        target = request.target
        queued = [p for p in self.waiting.get(target, []) if self._in_the_way(p)]
        running = self.active.get(target)
        if running is not None and not self._in_the_way(running):
            running = None
        if running is None and not queued:
            return
        if not request.queue:
            raise ConflictError(
                f"profile {running or queued[0]} is already running on {target!r}; retry when it ends or pass queue=true",
                target=target,
            )
        limit = self._config().max_queued_per_target
        if len(queued) >= limit:
            raise ConflictError(
                f"{len(queued)} profiles already queued on {target!r} (max {limit})", target=target
            )

    def _in_the_way(self, profile_id: str) -> bool:
        # A delete drops the profile from the catalog at once; its window task leaves the slot later.
        profile = self._profiles.get(profile_id)
        return profile is not None and not profile.state.is_terminal

    def join(self, profile: Profile) -> None:
        """Take a place in the target's line (before any await, so the next submit counts it)."""
        self.waiting.setdefault(profile.target, []).append(profile.id)

    def leave(self, profile: Profile) -> None:
        """Give up a place that was never run (its save failed)."""
        line = self.waiting.get(profile.target, [])
        if profile.id in line:
            line.remove(profile.id)
        if not line:
            self.waiting.pop(profile.target, None)

    async def run(self, profile: Profile, window: Callable[[Profile], Awaitable[None]]) -> None:
        """Wait for the target's slot, then run ``window`` holding it; the place is left however it ends."""
        target = profile.target
        slot = self._slots.setdefault(target, asyncio.Lock())
        try:
            async with slot:
                self.leave(profile)
                self.active[target] = profile.id
                try:
                    await window(profile)
                finally:
                    self.active.pop(target, None)
        finally:
            self.leave(profile)
            # Nobody else in line (every waiter for the slot is in it): a finished target leaves
            # nothing behind, however many uniquely named runs come and go.
            if target not in self.waiting and not slot.locked() and self._slots.get(target) is slot:
                del self._slots[target]
