"""Saving step-time histories in the controller's home storage, so they survive a restart.

One object per run, ``_rayprof/{cluster}/history/{target}/{run}.bin.gz`` (layout's ``history_key``),
rewritten whole every ``RAYPROF_HISTORY_SAVE_INTERVAL_S`` (a run of 1,024
ranks after 24 h is ~20 MiB before compression). A history that cannot be
read is logged and skipped; a restart then starts that run afresh.
"""

from __future__ import annotations

import asyncio
import logging

from actors.controller.monitoring.step_history import RunHistory, compress
from orchestrator.errors import StorageError
from orchestrator.layout import HISTORY_SUFFIX, history_key, history_prefix
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.storage import open_storage

__all__ = ["HistoryStore"]

logger = logging.getLogger(__name__)

class HistoryStore:
    def __init__(self, home: StorageSpec, cluster: str) -> None:
        self._home = home
        self._cluster = cluster

    def _key(self, target: str, run: str) -> str:
        return history_key(self._cluster, target, run)

    async def save(self, runs: list[RunHistory]) -> None:
        """Every run given; the dump is taken on the event loop, so it is one consistent instant."""
        blobs = [(self._key(r.target, r.run), r.dump()) for r in runs]
        storage = open_storage(self._home)

        def write() -> None:
            for key, data in blobs:
                storage.put_state(compress(data), key)

        await asyncio.to_thread(write)

    async def delete(self, run: RunHistory) -> None:
        await asyncio.to_thread(open_storage(self._home).delete, self._key(run.target, run.run))

    async def load(self) -> list[RunHistory]:
        """Every saved run; raises :class:`StorageError` when storage cannot be listed."""
        storage = open_storage(self._home).scoped(history_prefix(self._cluster))
        keys = await asyncio.to_thread(storage.list, "")
        found = []
        for key in keys:
            if not key.endswith(HISTORY_SUFFIX):
                continue
            try:
                found.append(await asyncio.to_thread(lambda k=key: RunHistory.load(storage.get_bytes(k))))
            except StorageError:
                raise
            except (ValueError, KeyError, EOFError, OSError) as e:
                logger.warning("rayprof controller: skipping unreadable history %s: %s", key, e)
        return found
