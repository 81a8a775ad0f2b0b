"""The controller's memory on storage: every profile's state, and the storage configured at run time.

State lives in the controller's *home* storage (the one it was constructed
with), under ``_rayprof/{cluster}/``, so a restarted actor finds it again and
two clusters sharing a root never adopt each other's profiles. Every call
either succeeds or raises :class:`StorageError`; none hangs: the storage
backends retry and time out.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from actors.controller.state import Profile
from orchestrator.diagnosis import WatchStatus
from orchestrator.errors import StorageError
from orchestrator.layout import config_key, manifest_key, state_key, state_prefix, watch_key, watches_prefix
from orchestrator.manifest import read_manifest, write_manifest
from orchestrator.models import Manifest, ProfileStatus, StorageSpec
from orchestrator.storage import open_storage

__all__ = ["Persistence", "SavedProfile"]

logger = logging.getLogger(__name__)


class SavedProfile(BaseModel):
    """A profile as persisted in the controller's home storage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: ProfileStatus
    storage: StorageSpec
    window_note: str | None = None
    cancel_requested: bool = False

    def profile(self) -> Profile:
        return Profile.restore(self.status, self.storage, self.window_note, self.cancel_requested)


@dataclass
class _Saves:
    # Group commit: changes asked to be saved / changes saved, as counters.
    asked: int = 0
    done: int = 0


class Persistence:
    """Saves and restores profiles; one instance per controller."""

    def __init__(self, home: StorageSpec, cluster: str) -> None:
        self._home = home
        self._cluster = cluster
        self._lock = asyncio.Lock()
        self._saves: dict[str, _Saves] = {}

    async def save(self, profile: Profile) -> None:
        """Save ``profile`` as it is now. Callers that arrive during a write share
        the next one, so a thousand ranks finishing at once cost a few writes."""
        saves = self._saves.setdefault(profile.id, _Saves())
        saves.asked += 1
        wanted = saves.asked
        async with self._lock:
            if saves.done >= wanted:
                return
            covered = saves.asked
            saved = SavedProfile(
                status=profile.snapshot(),
                storage=profile.storage,
                window_note=profile.window.note if profile.window else None,
                cancel_requested=profile.cancel_requested,
            )
            storage = open_storage(self._home)
            await asyncio.to_thread(
                storage.put_bytes, saved.model_dump_json().encode(), state_key(self._cluster, profile.id), "manifest"
            )
            saves.done = covered

    def forget(self, profile_id: str) -> None:
        """Drop the save counters of a profile that is no longer kept in memory."""
        self._saves.pop(profile_id, None)

    async def delete(self, profile_id: str) -> None:
        """Remove a profile's saved state."""
        self.forget(profile_id)
        await asyncio.to_thread(open_storage(self._home).delete, state_key(self._cluster, profile_id))

    async def load_config(self) -> StorageSpec | None:
        """The storage configured at run time, if one was."""
        storage = open_storage(self._home)
        key = config_key(self._cluster)
        if not await asyncio.to_thread(storage.exists, key):
            return None
        return StorageSpec.model_validate_json(await asyncio.to_thread(storage.get_bytes, key))

    async def save_config(self, spec: StorageSpec) -> None:
        storage = open_storage(self._home)
        await asyncio.to_thread(storage.put_bytes, spec.model_dump_json().encode(), config_key(self._cluster), "manifest")

    async def load_profiles(self) -> list[SavedProfile]:
        """Every profile this cluster's controller saved; unreadable ones are logged and skipped."""
        storage = open_storage(self._home)
        keys = await asyncio.to_thread(storage.list, state_prefix(self._cluster))
        found: list[SavedProfile] = []
        for key in keys:
            try:
                found.append(SavedProfile.model_validate_json(await asyncio.to_thread(storage.get_bytes, key)))
            except StorageError:
                raise
            except ValueError as e:
                logger.warning("rayprof controller: skipping unreadable state %s: %s", key, e)
        return found

    async def save_watch(self, watch: WatchStatus) -> None:
        storage = open_storage(self._home)
        await asyncio.to_thread(
            storage.put_bytes, watch.model_dump_json().encode(), watch_key(self._cluster, watch.id), "manifest"
        )

    async def delete_watch(self, watch_id: str) -> None:
        await asyncio.to_thread(open_storage(self._home).delete, watch_key(self._cluster, watch_id))

    async def load_watches(self) -> list[WatchStatus]:
        """Every watch this cluster's controller saved; unreadable ones are logged and skipped."""
        storage = open_storage(self._home)
        found: list[WatchStatus] = []
        for key in await asyncio.to_thread(storage.list, watches_prefix(self._cluster)):
            try:
                found.append(WatchStatus.model_validate_json(await asyncio.to_thread(storage.get_bytes, key)))
            except StorageError:
                raise
            except ValueError as e:
                logger.warning("rayprof controller: skipping unreadable watch %s: %s", key, e)
        return found

    @staticmethod
    async def stored_manifest(profile: Profile) -> Manifest | None:
        """The manifest of ``profile`` if it was written (the commit point), else ``None``."""
        storage = open_storage(profile.storage)
        if not await asyncio.to_thread(storage.exists, manifest_key(profile.target, profile.id)):
            return None
        return await asyncio.to_thread(read_manifest, storage, profile.target, profile.id)

    @staticmethod
    async def write_manifest(profile: Profile, manifest: Manifest) -> str:
        """Write the manifest, once; returns its URI."""
        return await asyncio.to_thread(write_manifest, open_storage(profile.storage), manifest)

    @staticmethod
    async def read_manifest(profile: Profile) -> Manifest:
        return await asyncio.to_thread(read_manifest, open_storage(profile.storage), profile.target, profile.id)
