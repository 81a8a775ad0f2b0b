"""Every profile one controller knows: unfinished ones in full, finished ones as summaries.

A finished profile is never changed again, and a cluster keeps up to 1,000 of
them (``RAYPROF_RETENTION_COUNT``): holding each in full cost ~0.3 MiB at 64
ranks and made a restart read every state file. So a finished profile is kept
as a summary (:class:`Finished`); its full record is read from its state file
when one profile is asked for, and the last few read stay cached. The
summaries are also saved as one index file, written after each finish, so a
restart lists the state files and reads the index, plus only the state files
the index does not cover (unfinished profiles, and any finished after the
index was last written). A missing or unreadable index is rebuilt from the
state files.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from actors.controller.monitoring.post_window_check import awaits_check
from actors.controller.profiles.state import Profile, Record
from actors.controller.saved.group_commit import GroupCommit
from actors.controller.saved.persistence import Finished, Persistence
from orchestrator.errors import ConflictError, ProfileNotFoundError, StorageError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.profile import Trigger
from orchestrator.models.requests import ProfileState
from orchestrator.models.summaries import ProfilePage

__all__ = ["Catalog", "Loaded", "finished_entry"]

logger = logging.getLogger(__name__)

# Full records of finished profiles kept after a read: a client that waited on a
# profile asks for it and its manifest next, and window planning sizes a new
# window from the latest like it on the same target. 32 x 64 ranks is ~10 MiB.
_RECENT = 32


def finished_entry(profile: Record) -> Finished:
    return Finished(
        summary=profile.summary(),
        storage=profile.storage,
        submit_key=profile.submit_key if isinstance(profile, Profile) else None,
        post_window_pending=awaits_check(profile),
    )


@dataclass(frozen=True)
class Loaded:
    """Saved profiles read by :meth:`Catalog.load`, not yet adopted."""

    finished: dict[str, Finished]
    unfinished: list[Record]
    # The index missed some finished profiles, or listed deleted ones: save it again.
    stale_index: bool


class Catalog:
    def __init__(self, persistence: Persistence) -> None:
        self._persistence = persistence
        # Unfinished profiles, and finished ones until the controller moves them out.
        self.live: dict[str, Record] = {}
        self.finished: dict[str, Finished] = {}
        self._recent: OrderedDict[str, Record] = OrderedDict()
        self._index_lock = asyncio.Lock()
        self._commits = GroupCommit()

    def __contains__(self, profile_id: str) -> bool:
        return profile_id in self.live or profile_id in self.finished

    def add(self, profile: Record) -> None:
        """Hold a new profile (or stacks bundle) as live, from now until :meth:`finish`."""
        self.live[profile.id] = profile

    async def load(self) -> Loaded:
        """Read what the index and the state files hold, changing nothing here: a restore that
        fails at any later step has adopted nothing, and the next attempt starts over.
        Raises :class:`StorageError` when storage cannot be read."""
        ids = await self._persistence.saved_ids()
        index = await self._persistence.load_index()
        # An entry whose state file is gone was deleted after the index was written.
        indexed = {e.id: e for e in index or [] if e.id in ids and e.id not in self.live}
        unfinished: list[Record] = []
        for profile_id in sorted(ids - indexed.keys() - self.live.keys() - self.finished.keys()):
            profile = await self._persistence.load_profile(profile_id)
            if profile is None:
                continue
            if profile.state.is_terminal:
                indexed[profile.id] = finished_entry(profile)
            else:
                unfinished.append(profile)
        stale = index is None or indexed.keys() != {e.id for e in index}
        return Loaded(indexed, unfinished, stale)

    def adopt(self, loaded: Loaded) -> list[Record]:
        """Take in what :meth:`load` read, at once (no await); returns the unfinished profiles, now live."""
        self.finished.update(loaded.finished)
        for profile in loaded.unfinished:
            self.live[profile.id] = profile
        return loaded.unfinished

    async def settle(self, loaded: Loaded) -> None:
        """After :meth:`adopt`: save a rebuilt index, read what window planning needs. Never raises
        :class:`StorageError` (logged): what was adopted stays adopted."""
        if loaded.stale_index:
            await self.save_index()
        await self._load_latest_per_target()

    async def _load_latest_per_target(self) -> None:
        # Window planning sizes a window from the latest finished one on its target.
        latest: dict[str, Finished] = {}
        for entry in self.finished.values():
            s = entry.summary
            if s.kind == "profile" and s.finished_at is not None:
                best = latest.get(s.target)
                if best is None or s.finished_at > (best.summary.finished_at or s.finished_at):
                    latest[s.target] = entry
        for entry in latest.values():
            try:
                await self.profile(entry.id)
            except StorageError as e:
                logger.warning("rayprof controller: cannot read %s: %s", entry.id, e)

    async def finish(self, profile: Record) -> None:
        """Keep a profile that has ended as a summary, and save the index."""
        if self.live.get(profile.id) is not profile or not profile.state.is_terminal:
            return
        del self.live[profile.id]
        self.finished[profile.id] = finished_entry(profile)
        self._persistence.forget(profile.id)
        self._remember(profile)
        await self.save_index()

    async def refresh(self, profile: Record) -> None:
        """A finished profile changed after it finished (its post-window check ended): its entry too."""
        entry = self.finished.get(profile.id)
        if entry is not None and entry != (fresh := finished_entry(profile)):
            self.finished[profile.id] = fresh
            await self.save_index()

    def triggered(self) -> list[tuple[str, Trigger]]:
        """(id, trigger) of every profile and bundle a watch or the stall detector took."""
        found = [(p.id, p.trigger) for p in self.live.values() if p.trigger is not None]
        return found + [(e.id, e.summary.trigger) for e in self.finished.values() if e.summary.trigger is not None]

    def awaiting_checks(self) -> list[str]:
        """Finished profiles whose post-window check had no verdict when last saved."""
        return [e.id for e in self.finished.values() if e.post_window_pending]

    async def profile(self, profile_id: str) -> Record:
        """One profile in full: a finished one is read from its state file unless cached."""
        if profile_id in self.live:
            return self.live[profile_id]
        if profile_id in self._recent:
            self._recent.move_to_end(profile_id)
            return self._recent[profile_id]
        if profile_id not in self.finished:
            raise ProfileNotFoundError(f"no profile with id {profile_id!r}", profile_id=profile_id)
        profile = await self._persistence.load_profile(profile_id)
        if profile is None:
            raise StorageError(f"the saved state of profile {profile_id} is unreadable", profile_id=profile_id)
        if profile_id in self.finished:
            self._remember(profile)
        return profile

    async def ended(self, profile_id: str) -> Finished:
        """A finished profile's entry; a conflict while it still runs."""
        profile = self.live.get(profile_id)
        if profile is not None and not profile.state.is_terminal:
            raise ConflictError(
                f"profile {profile_id} is {profile.state.value}; cancel it before deleting", profile_id=profile_id
            )
        if profile is not None:
            return finished_entry(profile)
        if profile_id not in self.finished:
            raise ProfileNotFoundError(f"no profile with id {profile_id!r}", profile_id=profile_id)
        return self.finished[profile_id]

    def storage_of(self, profile_id: str) -> StorageSpec:
        """The storage a profile was written to, as its record names it (not the storage configured now)."""
        if profile_id in self.live:
            return self.live[profile_id].storage
        if profile_id not in self.finished:
            raise ProfileNotFoundError(f"no profile with id {profile_id!r}", profile_id=profile_id)
        return self.finished[profile_id].storage

    def known(self) -> list[Record]:
        """Profiles held in full: every unfinished one and the recently read finished ones."""
        return [*self.live.values(), *self._recent.values()]

    def remove(self, profile_id: str) -> None:
        """Forget a deleted profile; :meth:`save_index` saves that."""
        self.live.pop(profile_id, None)
        self.finished.pop(profile_id, None)
        self._recent.pop(profile_id, None)

    def page(self, target: str | None, state: ProfileState | None, limit: int, offset: int) -> ProfilePage:
        """One page of summaries, newest first."""
        summaries = [p.summary() for p in self.live.values()]
        summaries += [e.summary for e in self.finished.values()]
        found = sorted(
            (s for s in summaries if (target is None or s.target == target) and (state is None or s.state == state)),
            key=lambda s: s.created_at,
            reverse=True,
        )
        return ProfilePage(profiles=found[offset : offset + limit], total=len(found), offset=offset, limit=limit)

    async def save_index(self) -> None:
        """Save the index; callers during a write share the next one. A failure is logged, not
        raised: the next restart reads the state files the index missed."""

        async def write() -> None:
            await self._persistence.save_index(list(self.finished.values()))

        try:
            await self._commits.write(lambda: self._index_lock, write)
        except StorageError as e:
            logger.warning("rayprof controller: cannot save the index of finished profiles: %s", e)

    def _remember(self, profile: Record) -> None:
        self._recent[profile.id] = profile
        self._recent.move_to_end(profile.id)
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
