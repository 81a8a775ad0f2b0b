"""Old profiles expire: the newest ``retention_count`` finished profiles a user asked for are kept, and
apart from them the newest ``retention_auto_count`` the controller took by itself (a watch, stacks on
STALLED: those with a trigger), none older than ``retention_days``; the rest are deleted from storage
(folder and saved state) and from memory. Two budgets, so a watch that fires often only ever pushes
out what watches took, never a profile someone asked for. Ages and retries are read on the controller's
clock (:mod:`actors.controller.clock`), so a test steps past a retention instead of sleeping it out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from actors.controller.clock import Clock
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.persistence import Finished, Persistence
from orchestrator.errors import StorageError
from orchestrator.layout import profile_prefix
from orchestrator.models.control import ControllerConfig
from orchestrator.storage import open_storage

__all__ = ["RETRY_S", "Retention", "expired"]

logger = logging.getLogger(__name__)

# A delete that failed is tried again this long after, from the monitor tick: without it, what a
# failed round left stayed until the next profile ended, which may be never (a capped watch).
RETRY_S = 5.0


def expired(
    finished: Iterable[Finished], count: int, days: float, auto_count: int, now: datetime
) -> list[Finished]:
    """Finished profiles past the retention policy, oldest last: requested ones beyond the newest
    ``count``, automatic ones beyond the newest ``auto_count``, and any older than ``days`` at ``now``."""
    newest_first = sorted(finished, key=lambda e: e.summary.created_at, reverse=True)
    cutoff = now - timedelta(days=days)
    seen = {"requested": 0, "automatic": 0}
    due = []
    for e in newest_first:
        budget = "requested" if e.summary.trigger is None else "automatic"
        seen[budget] += 1
        kept = count if budget == "requested" else auto_count
        if seen[budget] > kept or (e.summary.finished_at or e.summary.created_at) < cutoff:
            due.append(e)
    return due


class Retention:
    def __init__(self, persistence: Persistence, config: Callable[[], ControllerConfig], clock: Clock) -> None:
        self._persistence = persistence
        self._config = config
        self._clock = clock
        # One round at a time (a profile ending and the retry could race for the same folder).
        self._lock = asyncio.Lock()
        self._retry_at: float | None = None

    def retry_due(self, now: float) -> bool:
        """Whether a round left something it failed to delete, and its retry is due (monotonic ``now``)."""
        return self._retry_at is not None and now >= self._retry_at and not self._lock.locked()

    def due(self, catalog: Catalog) -> list[Finished]:
        """What the policy no longer keeps."""
        cfg = self._config()
        return expired(
            catalog.finished.values(), cfg.retention_count, cfg.retention_days, cfg.retention_auto_count, self._clock.wall()
        )

    async def enforce(self, catalog: Catalog) -> list[str]:
        """Delete what the policy no longer keeps; returns what failed. A storage error leaves
        that profile for the next round: the next profile to end, gc, or the monitor tick ``RETRY_S`` later."""
        async with self._lock:
            failed = await self._round(catalog)
        self._retry_at = self._clock.monotonic() + RETRY_S if failed else None
        return failed

    async def _round(self, catalog: Catalog) -> list[str]:
        failed = []
        due = self.due(catalog)
        for entry in due:
            try:
                await self.delete(entry)
            except StorageError as e:
                logger.warning("rayprof controller: cannot expire %s: %s", entry.id, e)
                failed.append(f"{entry.id}: {e}")
                continue
            catalog.remove(entry.id)
            logger.info("rayprof controller: expired %s", entry.id)
        if due:
            await catalog.save_index()
        return failed

    async def delete(self, entry: Finished) -> None:
        """Delete a profile's folder (its manifest first) and then its saved state."""
        prefix = profile_prefix(entry.summary.target, entry.id)
        await asyncio.to_thread(open_storage(entry.storage).delete_tree, prefix)
        await self._persistence.delete(entry.id)
