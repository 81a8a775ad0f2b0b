"""The one commit point: how a profile or a stacks bundle ends.

Every artifact a manifest lists is stored before it; the manifest is written
last, and its existence is what makes the folder complete (clients, gc and a
restarted controller all read it so). Then the terminal state is recorded and
saved, and the folder's owner lease is removed. A manifest that cannot be
written ends the record FAILED, with why.
"""

from __future__ import annotations

import logging

from actors.controller.profiles.state import Record
from actors.controller.saved.leases import Leases
from actors.controller.saved.persistence import Persistence
from orchestrator.errors import StorageError
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileState

__all__ = ["Commit"]

logger = logging.getLogger(__name__)


class Commit:
    """Saves records (profiles and stacks bundles) and ends them; one per controller, shared by the runner and the stacks taker."""

    def __init__(self, persistence: Persistence, leases: Leases) -> None:
        self._persistence = persistence
        self._leases = leases

    async def transition(self, profile: Record, state: ProfileState) -> None:
        """Change state, then save it; a save that fails is logged, and the next change saves again."""
        previous = profile.transition(state)
        logger.info("rayprof controller: %s %s -> %s", profile.id, previous.value, state.value)
        await self.save(profile)

    async def save(self, profile: Record) -> None:
        """Save the record as it is now; a failure is logged (the next save covers it)."""
        try:
            await self._persistence.save(profile)
        except StorageError as e:
            logger.warning("rayprof controller: cannot save %s: %s", profile.id, e)

    async def end(self, profile: Record, state: ProfileState, reason: str | None, manifest: Manifest | None) -> ProfileState:
        """Write ``manifest`` (none: nothing is written; the record ends without one, or with the one
        a controller wrote before it restarted, already set on it), record ``state`` with ``reason``,
        save, release the lease; returns the state recorded (FAILED when the manifest could not be written).

        The lease goes last, whatever the state, and only here: it keeps another cluster's gc off a
        folder that is still being written. Once the terminal state is saved, nothing writes to the
        folder again, and either its manifest protects it or, without one, what it holds is a
        leftover that gc may take. Released before the save, a controller that stopped in between
        would restore an unfinished record whose folder nothing protects. A release that fails is
        retried by the renewal round, which removes the lease of every ended record it holds.
        """
        if manifest is not None:
            try:
                profile.manifest_uri = await self._persistence.write_manifest(profile, manifest)
                profile.manifest = manifest
            except StorageError as e:
                state, reason = ProfileState.FAILED, f"could not write the manifest: {e}"
        profile.reason = reason
        await self.transition(profile, state)
        await self._leases.release(profile)
        return state
