"""The lease a live controller holds on its cluster name's saved state.

Two Ray clusters started with one ``RAYPROF_CLUSTER_NAME`` on one storage root
share ``_rayprof/{cluster}/``: the second would adopt the first's running
profiles and save them FAILED. So before it restores anything a controller
writes ``lease.json`` (its Ray cluster's id and an expiry) and renews it every
third of ``RAYPROF_CLUSTER_NAME_LEASE_S``; a controller of another Ray cluster that finds
an unexpired lease refuses to start, and tries again until the lease expires.
A restarted controller of the same Ray cluster takes the lease at once: Ray
runs one named controller per cluster, so the old one is gone.

Storage offers no compare-and-swap here: two controllers that start within one
read and write of each other can both pass the first check; each write is read
back, and the loser finds the other's lease at its next renewal at the latest.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict

from orchestrator.errors import ClusterNameInUseError, StorageError
from orchestrator.layout import lease_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.settings import CLUSTER_NAME_ENV_VAR, CLUSTER_NAME_LEASE_S_ENV_VAR
from orchestrator.storage import open_storage

__all__ = ["LeaseRecord", "NameLease"]

logger = logging.getLogger(__name__)


class LeaseRecord(BaseModel):
    """``_rayprof/{cluster}/lease.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str
    # Aware: a file without a timezone (another tool's, a hand edit) is unreadable, so replaced,
    # never compared with this controller's clock (which raised, and wedged every restore).
    renewed_at: AwareDatetime
    expires_at: AwareDatetime


class NameLease:
    """This controller's hold on ``cluster`` under ``home``; ``owner`` is its Ray cluster's id."""

    def __init__(self, home: StorageSpec, cluster: str, owner: str) -> None:
        self._home = home
        self._cluster = cluster
        self._owner = owner

    async def acquire(self, lease_s: float) -> None:
        """Take or renew the lease. Raises :class:`ClusterNameInUseError` when another Ray cluster
        holds it unexpired, :class:`StorageError` when storage fails (then nothing is known)."""
        held = await self._read()
        if held is not None:
            self._check(held)
        now = utcnow()
        mine = LeaseRecord(owner=self._owner, renewed_at=now, expires_at=now + timedelta(seconds=lease_s))
        storage = open_storage(self._home)
        await asyncio.to_thread(storage.put_bytes, mine.model_dump_json().encode(), lease_key(self._cluster), "manifest")
        # Read back: of two controllers that wrote at once, the one whose write landed last holds it.
        after = await self._read()
        if after is not None:
            self._check(after)

    async def keep(self, lease_s: float) -> ClusterNameInUseError:
        """Renew every third of the lease until another Ray cluster is found holding it; returns that error.
        A renewal that fails on storage is logged and tried again at the next turn."""
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                await self.acquire(lease_s)
            except ClusterNameInUseError as e:
                return e
            except StorageError as e:
                logger.warning("rayprof controller: cannot renew the lease on %r: %s", self._cluster, e)

    async def _read(self) -> LeaseRecord | None:
        storage = open_storage(self._home)
        key = lease_key(self._cluster)
        if not await asyncio.to_thread(storage.exists, key):
            return None
        data = await asyncio.to_thread(storage.get_bytes, key)
        try:
            return LeaseRecord.model_validate_json(data)
        except ValueError as e:
            logger.warning("rayprof controller: replacing the unreadable lease %s: %s", key, e)
            return None

    def _check(self, held: LeaseRecord) -> None:
        now = utcnow()
        if held.owner == self._owner or held.expires_at <= now:
            return
        age_s = max(0.0, (now - held.renewed_at).total_seconds())
        raise ClusterNameInUseError(
            f"the cluster name {self._cluster!r} is in use: the rayprof controller of another live Ray cluster "
            f"({held.owner}) holds its lease under {self._home.uri} (renewed {age_s:.0f}s ago, expires "
            f"{held.expires_at.isoformat(timespec='seconds')}). This controller adopts none of its profiles and "
            f"serves nothing. Fix: give this cluster its own name ({CLUSTER_NAME_ENV_VAR}=another-name, or unset it "
            f"to use the Ray cluster id), or stop the other cluster: this controller starts by itself once the "
            f"lease has gone {CLUSTER_NAME_LEASE_S_ENV_VAR} unrenewed."
        )
