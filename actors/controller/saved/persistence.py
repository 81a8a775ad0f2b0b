"""The controller's memory on storage: every profile's state, and the storage configured at run time.

State lives in the controller's *home* storage (the one it was constructed
with), under ``_rayprof/{cluster}/``, so a restarted actor finds it again and
two clusters sharing a root never adopt each other's profiles. Every call
either succeeds or raises :class:`StorageError`; none hangs: the storage
backends retry and time out.

Writes to one key are sequenced: a delete waits for a save of the same
profile or watch that is in flight, and no save lands after the delete, so a
deleted record stays deleted after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from actors.controller.profiles.idempotency import SubmitKey
from actors.controller.profiles.state import Record, load_record
from actors.controller.saved.group_commit import GroupCommit
from orchestrator.errors import AlreadyExistsError, StorageError
from orchestrator.layout import (
    config_key,
    index_key,
    manifest_key,
    state_key,
    state_prefix,
    watch_key,
    watches_prefix,
)
from orchestrator.manifest import read_manifest, write_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.diagnosis import WatchStatus
from orchestrator.models.profile import Manifest
from orchestrator.models.summaries import ProfileSummary
from orchestrator.storage import open_storage

__all__ = ["Finished", "Persistence", "SavedIndex"]

logger = logging.getLogger(__name__)

# A manifest write that fails is tried again 0.25, 0.5, 1 and 2 s later (S3 also retries each try).
_MANIFEST_ATTEMPTS = 5
_MANIFEST_FIRST_DELAY_S = 0.25
_MANIFEST_MAX_DELAY_S = 2.0


class Finished(BaseModel):
    """What the controller keeps in memory of a finished profile: enough to list it,
    expire it and find its full record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    summary: ProfileSummary
    storage: StorageSpec
    submit_key: SubmitKey | None = None
    # Its post-window check had no verdict yet: a restarted controller resumes it (or ends it).
    post_window_pending: bool = False

    @property
    def id(self) -> str:
        return self.summary.id


class SavedIndex(BaseModel):
    """The index of a cluster's finished profiles: a restart reads this instead of every state file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    profiles: list[Finished]


# Deleted keys remembered so a late save is dropped: ids are never reused, and a save
# trails its delete by one write at most, so the newest few thousand are plenty.
_DELETED_KEPT = 10_000


@dataclass
class _KeyLock:
    lock: asyncio.Lock
    # Callers holding or waiting for the lock: it is dropped when none is left.
    users: int = 0


class _Sequencer:
    """One write at a time per key, and no write to a key after its delete."""

    def __init__(self) -> None:
        self._locks: dict[str, _KeyLock] = {}
        self._deleted: OrderedDict[str, None] = OrderedDict()

    def deleted(self, key: str) -> bool:
        return key in self._deleted

    def mark_deleted(self, key: str) -> None:
        self._deleted[key] = None
        while len(self._deleted) > _DELETED_KEPT:
            self._deleted.popitem(last=False)

    def unmark_deleted(self, key: str) -> None:
        self._deleted.pop(key, None)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        held = self._locks.setdefault(key, _KeyLock(asyncio.Lock()))
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:
                del self._locks[key]


class Persistence:
    """Saves and restores profiles; one instance per controller."""

    def __init__(self, home: StorageSpec, cluster: str) -> None:
        self._home = home
        self._cluster = cluster
        self._keys = _Sequencer()
        self._saves: dict[str, GroupCommit] = {}

    async def save(self, profile: Record) -> None:
        """Save ``profile`` as it is now. Callers that arrive during a write share
        the next one, so a thousand ranks finishing at once cost a few writes."""
        saves = self._saves.setdefault(profile.id, GroupCommit())
        key = state_key(self._cluster, profile.id)

        async def write() -> None:
            # The record as it is when this write starts: it covers every change asked before.
            if not self._keys.deleted(key):
                data = profile.model_dump_json().encode()
                await asyncio.to_thread(open_storage(self._home).put_state, data, key)

        await saves.write(lambda: self._keys.hold(key), write)
        # A finished profile is saved again after the catalog forgot it (its post-window check):
        # its counters go once nothing is pending, or every profile ever run would keep a pair.
        if profile.state.is_terminal and saves.settled and self._saves.get(profile.id) is saves:
            del self._saves[profile.id]

    def forget(self, profile_id: str) -> None:
        """Drop the save counters of a profile that is no longer kept in memory."""
        self._saves.pop(profile_id, None)

    async def delete(self, profile_id: str) -> None:
        """Remove a profile's saved state, after any save of it in flight; later saves are dropped."""
        self.forget(profile_id)
        await self._delete(state_key(self._cluster, profile_id))

    async def _delete(self, key: str) -> None:
        # Marked first: a save waiting for the key gives up once it gets it.
        self._keys.mark_deleted(key)
        # Shielded like a save: a cancelled caller must not let a queued write slip in before the delete.
        await asyncio.shield(self._delete_now(key))

    async def _delete_now(self, key: str) -> None:
        async with self._keys.hold(key):
            try:
                await asyncio.to_thread(open_storage(self._home).delete, key)
            except Exception:
                # Still there: the record lives on, and so do its saves.
                self._keys.unmark_deleted(key)
                raise

    async def load_config(self) -> StorageSpec | None:
        """The storage configured at run time, if one was."""
        storage = open_storage(self._home)
        key = config_key(self._cluster)
        if not await asyncio.to_thread(storage.exists, key):
            return None
        return StorageSpec.model_validate_json(await asyncio.to_thread(storage.get_bytes, key))

    async def save_config(self, spec: StorageSpec) -> None:
        storage = open_storage(self._home)
        await asyncio.to_thread(storage.put_state, spec.model_dump_json().encode(), config_key(self._cluster))

    async def saved_ids(self) -> set[str]:
        """Ids of every profile this cluster's controller saved: one listing, no reads."""
        names = await asyncio.to_thread(open_storage(self._home).scoped(state_prefix(self._cluster)).list, "")
        return {n[: -len(".json")] for n in names if n.endswith(".json") and "/" not in n}

    async def load_profile(self, profile_id: str) -> Record | None:
        """One saved profile (in today's format or the one before); ``None`` when it is unreadable (logged)."""
        key = state_key(self._cluster, profile_id)
        data = await asyncio.to_thread(open_storage(self._home).get_bytes, key)
        try:
            return load_record(data)
        except ValueError as e:
            logger.warning("rayprof controller: skipping unreadable state %s: %s", key, e)
            return None

    async def load_index(self) -> list[Finished] | None:
        """The finished profiles' index; ``None`` when it is missing or unreadable (then rebuilt)."""
        storage = open_storage(self._home)
        key = index_key(self._cluster)
        if not await asyncio.to_thread(storage.exists, key):
            return None
        data = await asyncio.to_thread(storage.get_bytes, key)
        try:
            return SavedIndex.model_validate_json(data).profiles
        except ValueError as e:
            logger.warning("rayprof controller: rebuilding the unreadable index %s: %s", key, e)
            return None

    async def save_index(self, finished: list[Finished]) -> None:
        data = SavedIndex(profiles=finished).model_dump_json().encode()
        await asyncio.to_thread(open_storage(self._home).put_state, data, index_key(self._cluster))

    async def save_watch(self, watch: WatchStatus) -> None:
        """Save a watch as it is now; dropped once the watch was deleted."""
        key = watch_key(self._cluster, watch.id)
        await asyncio.shield(self._save_watch(key, watch.model_dump_json().encode()))

    async def _save_watch(self, key: str, data: bytes) -> None:
        async with self._keys.hold(key):
            if not self._keys.deleted(key):
                await asyncio.to_thread(open_storage(self._home).put_state, data, key)

    async def delete_watch(self, watch_id: str) -> None:
        """Remove a saved watch, after any save of it in flight; later saves are dropped."""
        await self._delete(watch_key(self._cluster, watch_id))

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
    async def stored_manifest(profile: Record) -> Manifest | None:
        """The manifest of ``profile`` if it was written (the commit point), else ``None``."""
        storage = open_storage(profile.storage)
        if not await asyncio.to_thread(storage.exists, manifest_key(profile.target, profile.id)):
            return None
        return await asyncio.to_thread(read_manifest, storage, profile.target, profile.id)

    @staticmethod
    async def write_manifest(profile: Record, manifest: Manifest) -> str:
        """Write the manifest, once; returns its URI.

        Every artifact it lists is already stored, so one failed write must not fail
        the profile: it is tried again with backoff (S3 retries each call on its own
        too; a file system does not). A try whose write landed but whose answer was
        lost finds the same manifest there, which is success, never a replacement.
        """
        storage = open_storage(profile.storage)
        delay = _MANIFEST_FIRST_DELAY_S
        for attempt in range(1, _MANIFEST_ATTEMPTS + 1):
            try:
                return await asyncio.to_thread(write_manifest, storage, manifest)
            except AlreadyExistsError:
                stored = await asyncio.to_thread(read_manifest, storage, profile.target, profile.id)
                if stored != manifest:
                    raise
                return storage.uri(manifest_key(profile.target, profile.id))
            except StorageError as e:
                if attempt == _MANIFEST_ATTEMPTS:
                    raise
                logger.warning("rayprof controller: manifest of %s: attempt %d/%d failed (%s); retrying in %.2fs",
                               profile.id, attempt, _MANIFEST_ATTEMPTS, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MANIFEST_MAX_DELAY_S)
        raise AssertionError("unreachable")

    @staticmethod
    async def read_manifest(profile: Record) -> Manifest:
        return await asyncio.to_thread(read_manifest, open_storage(profile.storage), profile.target, profile.id)
