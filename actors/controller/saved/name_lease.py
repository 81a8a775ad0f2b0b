"""The lease a live controller holds on its cluster name's saved state.

Two Ray clusters started with one ``RAYPROF_CLUSTER_NAME`` on one storage root
share ``_rayprof/{cluster}/``: the second would adopt the first's running
profiles and save them FAILED. So before it restores anything a controller
claims the name's lease and renews it every third of ``RAYPROF_CLUSTER_NAME_LEASE_S``.

The lease is a sequence of records ``_rayprof/{cluster}/lease/{generation}.json``,
each written only if absent (S3's conditional put ``If-None-Match: *``; a hard
link on a file system): of controllers that claim one generation at once,
exactly one wins. The holder renews by claiming the next generation. A
controller of another Ray cluster never reads a time from the record (its host's
clock may run minutes ahead or behind): it takes the name only after it has seen
the newest generation stand still for a whole lease by its own monotonic clock,
and then by claiming the next generation, so two such controllers cannot both
take it; the old holder finds the newer generation at its next renewal and
stops. A restarted controller of the same Ray cluster claims the next generation
at once: Ray runs one named controller per cluster, so the old one is gone. A
record that cannot be read (another tool's, a hand edit) holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import AlreadyExistsError, ClusterNameInUseError, StorageError
from orchestrator.layout import lease_prefix, lease_record_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.settings import CLUSTER_NAME_ENV_VAR, CLUSTER_NAME_LEASE_S_ENV_VAR
from orchestrator.storage import Storage, open_storage

__all__ = ["LeaseRecord", "NameLease"]

logger = logging.getLogger(__name__)

_GENERATION = re.compile(r"^(\d{1,20})\.json$")


class LeaseRecord(BaseModel):
    """``_rayprof/{cluster}/lease/{generation}.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str
    generation: int = Field(ge=1)
    # For people reading the file: no controller decides anything from another host's clock.
    renewed_at: AwareDatetime


class NameLease:
    """This controller's hold on ``cluster`` under ``home``; ``owner`` is its Ray cluster's id. ``clock`` (this
    controller's monotonic clock) times how long another holder's renewals stood still; tests move it."""

    def __init__(self, home: StorageSpec, cluster: str, owner: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._home = home
        self._cluster = cluster
        self._owner = owner
        self._clock = clock
        # The generation this controller last claimed; another owner's newest, and when it was first seen.
        self._mine: int | None = None
        self._seen: tuple[int, float] | None = None

    async def acquire(self, lease_s: float) -> None:
        """Claim (or renew) the lease. Raises :class:`ClusterNameInUseError` while another Ray cluster holds
        it (renewed within the last ``lease_s`` of this controller's clock, or claimed first), and when
        this controller's hold was taken over; :class:`StorageError` when storage fails."""
        storage = open_storage(self._home)
        generations, holder = await asyncio.to_thread(self._newest, storage)
        newest = max(generations, default=0)
        if holder is not None and holder != self._owner:
            self._wait_out(newest, holder, lease_s)
        record = LeaseRecord(owner=self._owner, generation=newest + 1, renewed_at=utcnow())
        key = lease_record_key(self._cluster, newest + 1)
        try:
            await asyncio.to_thread(storage.put_state, record.model_dump_json().encode(), key, if_absent=True)
        except AlreadyExistsError:
            # Another controller claimed this generation first: the name is its.
            _, winner = await asyncio.to_thread(self._newest, storage)
            raise self._in_use(winner or "unknown", newest + 1, 0.0, lease_s) from None
        self._mine, self._seen = newest + 1, None
        for old in generations:
            if old < newest:  # the newest two stay: a reader between a claim and this prune finds one
                await asyncio.to_thread(_delete_quietly, storage, lease_record_key(self._cluster, old))

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

    def _newest(self, storage: Storage) -> tuple[list[int], str | None]:
        """The lease's generations in storage, and the owner of the newest (None: none, or unreadable)."""
        generations = sorted(
            int(m.group(1))
            for name in storage.scoped(lease_prefix(self._cluster)).list("")
            if (m := _GENERATION.match(name))
        )
        if not generations:
            return [], None
        key = lease_record_key(self._cluster, generations[-1])
        try:
            record = LeaseRecord.model_validate_json(storage.get_bytes(key))
        except ValidationError as e:
            logger.warning("rayprof controller: the lease record %s is unreadable; it holds nothing: %s", key, e)
            return generations, None
        return generations, record.owner

    def _wait_out(self, generation: int, holder: str, lease_s: float) -> None:
        """Raise unless ``holder``'s ``generation`` has stood still for ``lease_s`` by this controller's clock."""
        now = self._clock()
        if self._mine is not None:
            raise self._in_use(holder, generation, 0.0, lease_s)  # this controller held it: taken over
        if self._seen is None or self._seen[0] != generation:
            self._seen = (generation, now)
        still_s = now - self._seen[1]
        if still_s < lease_s:
            raise self._in_use(holder, generation, still_s, lease_s)

    def _in_use(self, holder: str, generation: int, still_s: float, lease_s: float) -> ClusterNameInUseError:
        return ClusterNameInUseError(
            f"the cluster name {self._cluster!r} is in use: the rayprof controller of another live Ray cluster "
            f"({holder}) holds its lease under {self._home.uri} (renewal {generation}, seen unchanged for "
            f"{still_s:.0f}s of the {lease_s:g}s this controller waits, by its own clock). This controller adopts "
            f"none of its profiles and serves nothing. Fix: give this cluster its own name "
            f"({CLUSTER_NAME_ENV_VAR}=another-name, or unset it to use the Ray cluster id), or stop the other "
            f"cluster: this controller starts by itself once the lease has gone {CLUSTER_NAME_LEASE_S_ENV_VAR} "
            f"unrenewed."
        )


def _delete_quietly(storage: Storage, key: str) -> None:
    try:
        storage.delete(key)
    except StorageError as e:  # an old generation left behind is pruned at a later renewal
        logger.warning("rayprof controller: cannot prune the old lease record %s: %s", key, e)
