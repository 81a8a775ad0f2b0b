"""``rayprof gc``: apply retention now, and delete the folders nothing owns.

gc deletes only what it can prove finished (retention, as at every finish) or
abandoned. A leftover is a profile folder in the configured storage with no
manifest (so no finished profile), no saved state in any cluster's
``_rayprof/`` under this root (so no controller seen here will resume or list
it), not known to this controller, no owner lease that has not run out (a
cluster whose state lives elsewhere still runs it: see ``leases.py``), and made
longer ago than the grace period (its id says when): what a postprocess that
crashed before its commit point leaves behind. Folders whose names rayprof did
not give are never touched; folders holding no file are not reported. Ages and
leases are read against the controller's wall clock (:mod:`actors.controller.clock`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from actors.controller.clock import Clock
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.leases import lease_is_live
from actors.controller.saved.retention import Retention
from orchestrator.errors import StorageError
from orchestrator.layout import STATE_ROOT, id_created_at, manifest_key, profile_prefix, state_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig
from orchestrator.models.summaries import GcReport, GcRequest, Leftover
from orchestrator.storage import open_storage

__all__ = ["Cleanup", "find_leftovers"]

logger = logging.getLogger(__name__)


def find_leftovers(
    spec: StorageSpec,
    known: Callable[[str], bool],
    now: datetime,
    older_than: datetime,
    skipped: list[str] | None = None,
) -> list[Leftover]:
    """Leftover profile folders in ``spec``'s storage at ``now``; ``known`` says whether a controller holds
    an id. A folder kept only because its owner lease is unreadable is added to ``skipped``, with why."""
    storage = open_storage(spec)
    clusters = storage.folders(STATE_ROOT)
    found = []
    for target in storage.folders(""):
        if target == STATE_ROOT:
            continue
        for profile_id in storage.folders(target):
            created = id_created_at(profile_id)
            if created is None or created >= older_than or known(profile_id):
                continue
            if storage.exists(manifest_key(target, profile_id)):
                continue
            if any(storage.exists(state_key(cluster, profile_id)) for cluster in clusters):
                continue
            if lease_is_live(storage, target, profile_id, now, skipped):
                continue
            folder = storage.scoped(profile_prefix(target, profile_id))
            if not folder.list(""):
                continue
            found.append(Leftover(target=target, profile_id=profile_id, uri=folder.root_uri, created_at=created))
    return found


class Cleanup:
    def __init__(
        self, catalog: Catalog, retention: Retention, config: Callable[[], ControllerConfig], clock: Clock
    ) -> None:
        self._catalog = catalog
        self._retention = retention
        self._config = config
        self._clock = clock

    async def collect(self, request: GcRequest) -> GcReport:
        """Delete expired profiles and leftovers (with ``dry_run``, only list them). Raises
        :class:`StorageError` when the storage cannot be listed; a delete that fails is reported."""
        cfg = self._config()
        grace = timedelta(hours=request.grace_hours or cfg.gc_grace_hours)
        due = self._retention.due(self._catalog)
        skipped: list[str] = []
        now = self._clock.wall()
        leftovers = await asyncio.to_thread(find_leftovers, cfg.storage, self._catalog.__contains__, now, now - grace, skipped)
        if request.dry_run:
            return GcReport(dry_run=True, expired=[e.summary for e in due], leftovers=leftovers, skipped=skipped)
        failed = await self._retention.enforce(self._catalog)
        gone = [e.summary for e in due if e.id not in self._catalog]
        storage = open_storage(cfg.storage)
        deleted = []
        for leftover in leftovers:
            try:
                # Looked at again just before: an owner may have renewed its lease since the listing.
                if await asyncio.to_thread(lease_is_live, storage, leftover.target, leftover.profile_id, self._clock.wall()):
                    continue
                await asyncio.to_thread(storage.delete_tree, profile_prefix(leftover.target, leftover.profile_id))
            except StorageError as e:
                failed.append(f"{leftover.uri}: {e}")
                continue
            deleted.append(leftover)
            logger.info("rayprof controller: deleted leftover %s", leftover.uri)
        return GcReport(dry_run=False, expired=gone, leftovers=deleted, failed=failed, skipped=skipped)
