"""Old profiles expire: the newest ``retention_count`` finished profiles are kept, none older than
``retention_days``; the rest are deleted from storage (folder and saved state) and from memory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta

from actors.controller.persistence import Persistence
from actors.controller.state import Profile
from orchestrator.control import ControllerConfig
from orchestrator.errors import StorageError
from orchestrator.models import utcnow
from orchestrator.storage import open_storage

__all__ = ["Retention", "expired"]

logger = logging.getLogger(__name__)


def expired(profiles: list[Profile], count: int, days: float) -> list[Profile]:
    """Finished profiles past the retention policy, oldest last."""
    finished = sorted((p for p in profiles if p.state.is_terminal), key=lambda p: p.created_at, reverse=True)
    cutoff = utcnow() - timedelta(days=days)
    return [p for i, p in enumerate(finished) if i >= count or (p.finished_at or p.created_at) < cutoff]


class Retention:
    def __init__(self, persistence: Persistence, config: Callable[[], ControllerConfig]) -> None:
        self._persistence = persistence
        self._config = config

    async def enforce(self, profiles: dict[str, Profile]) -> None:
        """Delete what the policy no longer keeps; a storage error leaves that profile for the next round."""
        cfg = self._config()
        for profile in expired(list(profiles.values()), cfg.retention_count, cfg.retention_days):
            try:
                await self.delete(profile)
            except StorageError as e:
                logger.warning("rayprof controller: cannot expire %s: %s", profile.id, e)
                continue
            profiles.pop(profile.id, None)
            logger.info("rayprof controller: expired %s", profile.id)

    async def delete(self, profile: Profile) -> None:
        """Delete a profile's folder (its manifest first) and then its saved state."""
        await asyncio.to_thread(open_storage(profile.storage).delete_tree, profile.prefix)
        await self._persistence.delete(profile.id)
