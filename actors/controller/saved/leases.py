"""Owner leases: ``{target}/{id}/owner.json`` in each unfinished profile's folder.

Clusters that share a storage root may keep their saved state elsewhere (the
controller's home), where another cluster's ``gc`` cannot see it. So each
unfinished profile's folder names its owner and an expiry, renewed by the
owning controller every third of ``RAYPROF_OWNER_LEASE_S``; ``gc`` keeps a
folder whose lease has not run out, whoever owns it. A finished profile's
lease is removed: its manifest (the commit point) protects it from then on.
Leases are dated on the controller's wall clock (:mod:`actors.controller.clock`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import AwareDatetime, ValidationError

from actors.controller.clock import Clock
from actors.controller.profiles.state import Record
from orchestrator.errors import StorageError
from orchestrator.layout import cluster_state_prefix, owner_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import StrictModel
from orchestrator.models.control import ControllerConfig
from orchestrator.storage import Storage, open_storage

__all__ = ["Leases", "OwnerLease", "lease_is_live"]

logger = logging.getLogger(__name__)


class OwnerLease(StrictModel):
    """``owner.json``: who runs this profile, and until when it counts as running without a renewal."""

    cluster: str
    profile_id: str
    state_uri: str
    # Aware: one without a timezone is unreadable (kept, with the reason), never compared with the clock.
    renewed_at: AwareDatetime
    expires_at: AwareDatetime


def lease_is_live(
    storage: Storage, target: str, profile_id: str, now: datetime, unreadable: list[str] | None = None
) -> bool:
    """Whether the folder has a lease that has not run out. A lease that cannot be parsed counts as
    live: gc deletes only what it can prove abandoned; why is logged and added to ``unreadable``.
    Raises :class:`StorageError`."""
    key = owner_key(target, profile_id)
    if not storage.exists(key):
        return False
    try:
        return OwnerLease.model_validate_json(storage.get_bytes(key)).expires_at > now
    except ValidationError as e:
        reason = f"{storage.uri(key)}: kept, its owner lease is unreadable ({e.error_count()} errors: {_first(e)})"
        logger.warning("rayprof controller: %s", reason)
        if unreadable is not None:
            unreadable.append(reason)
        return True


def _first(e: ValidationError) -> str:
    error = e.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc']) or 'file'}: {error['msg']}"


class Leases:
    """Writes, renews and removes the leases of one controller's unfinished profiles."""

    def __init__(
        self,
        cluster: str,
        home: StorageSpec,
        config: Callable[[], ControllerConfig],
        profiles: dict[str, Record],
        clock: Clock,
    ) -> None:
        self._cluster = cluster
        self._clock = clock
        self._home = home
        self._config = config
        self._profiles = profiles
        # Leases written and not yet removed, by profile id.
        self._held: dict[str, Record] = {}
        # One write or removal of a profile's lease at a time: a renewal's write still in its thread when the profile
        # ends would land after the removal and leave its lease behind, renewed and removed by no one. Per profile:
        # one profile's storage that hangs must not hold up another's end. Dropped with the lease.
        self._writing: dict[str, asyncio.Lock] = {}

    async def hold(self, profile: Record) -> None:
        """Write ``profile``'s lease now, before anything is written to its folder. A storage error is
        logged: the renewal tries again, and the profile's own writes will say what failed."""
        self._held[profile.id] = profile
        await self._write(profile)

    async def renew_forever(self) -> None:
        """Renew now and every third of the lease; a failed round is logged, never fatal."""
        while True:
            try:
                await self.renew()
            except Exception:
                logger.exception("rayprof controller: owner lease renewal failed")
            await asyncio.sleep(self._config().owner_lease_s / 3)

    async def renew(self) -> None:
        """Renew the lease of every unfinished profile (restored ones included); remove finished ones'."""
        for profile in list(self._profiles.values()):
            if not profile.state.is_terminal:
                self._held[profile.id] = profile
        for profile in list(self._held.values()):
            if profile.state.is_terminal:
                await self._release(profile)
            else:
                await self._write(profile)

    async def _write(self, profile: Record) -> None:
        async with self._writing.setdefault(profile.id, asyncio.Lock()):
            if not profile.state.is_terminal:  # ended while this waited: the removal is due, not a renewal
                await self._put(profile)

    async def _put(self, profile: Record) -> None:
        now = self._clock.wall()
        lease = OwnerLease(
            cluster=self._cluster,
            profile_id=profile.id,
            state_uri=open_storage(self._home).uri(cluster_state_prefix(self._cluster)),
            renewed_at=now,
            expires_at=now + timedelta(seconds=self._config().owner_lease_s),
        )
        storage = open_storage(profile.storage)
        key = owner_key(profile.target, profile.id)
        try:
            await asyncio.to_thread(storage.put_state, lease.model_dump_json().encode(), key)
        except StorageError as e:
            logger.warning("rayprof controller: cannot renew the owner lease of %s: %s", profile.id, e)

    async def release(self, profile: Record) -> None:
        """Remove a finished profile's lease (its manifest protects it now), whoever wrote it: this
        controller, or the one before a restart (a restored record may end before a renewal round
        has taken its lease over); a failure is retried by the next renewal round."""
        self._held[profile.id] = profile
        await self._release(profile)

    async def _release(self, profile: Record) -> None:
        async with self._writing.setdefault(profile.id, asyncio.Lock()):
            try:
                await asyncio.to_thread(open_storage(profile.storage).delete, owner_key(profile.target, profile.id))
            except StorageError as e:
                logger.warning("rayprof controller: cannot remove the owner lease of %s (next round): %s", profile.id, e)
                return
            self._held.pop(profile.id, None)
            self._writing.pop(profile.id, None)
