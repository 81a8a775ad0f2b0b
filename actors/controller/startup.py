"""The control actor's start: take the cluster name's lease, restore saved state as one unit,
and keep calls that depend on that state from answering before it is restored.

Restore reads everything first (the lease, the configured storage, the
profiles, the watches) and adopts nothing until every read succeeded: a
storage error at any step leaves nothing half-adopted, and the retry starts
over. Once adopted, every unfinished profile is resumed, or finished when its
manifest shows it ended before the restart. Until then, or while another live
Ray cluster holds the cluster name, calls that read or change saved state
answer a 503 that says why (:class:`RestoringError`,
:class:`ClusterNameInUseError`); agents are served throughout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from actors.controller.diagnosis.watches import Watches
from actors.controller.live_config import LiveConfig
from actors.controller.monitoring.telemetry import Telemetry
from actors.controller.profiles.commit import Commit
from actors.controller.profiles.intake import Intake
from actors.controller.profiles.state import Profile
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.name_lease import NameLease
from actors.controller.saved.persistence import Persistence
from actors.controller.saved.retention import Retention
from orchestrator.errors import ClusterNameInUseError, RestoringError
from orchestrator.layout import manifest_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.scratch import sweep_orphans
from orchestrator.storage import open_storage

__all__ = ["Startup"]

logger = logging.getLogger(__name__)

# How often a controller that could not read its saved state, or whose name is taken, tries again.
RESTORE_RETRY_S = 5.0


class Startup:
    """Start and restore; mixed into :class:`actors.controller.actor.Controller`."""

    _settings: LiveConfig
    _home: StorageSpec
    _lease: NameLease
    _persistence: Persistence
    _catalog: Catalog
    _watches: Watches
    _commit: Commit
    _retention: Retention
    _intake: Intake
    _telemetry: Telemetry
    _ready: asyncio.Event | None
    # Set once saved state is adopted; until then calls that read or change it answer 503 with why.
    _restored: bool = False
    _refusal: ClusterNameInUseError | None = None
    _restore_error: str = "not read yet"

    def _spawn(self, coro: Any) -> asyncio.Task:
        raise NotImplementedError

    def _start_background(self) -> None:
        raise NotImplementedError

    async def _ensure_started(self) -> None:
        # Async actors have no async constructor; start background work on the
        # first call, and hold every call until the first attempt to restore
        # saved state has ended (if it failed, the controller serves agents and
        # keeps trying; see _restored_state).
        if self._ready is None:
            self._ready = asyncio.Event()
            self._start_background()
            # What the postprocess tasks of a controller killed mid-profile (a replacement) left on this node.
            self._spawn(asyncio.to_thread(sweep_orphans))
            try:
                if not await self._restore():
                    self._spawn(self._retry_restore())
            finally:
                self._ready.set()
        await self._ready.wait()

    async def _restored_state(self) -> None:
        """Before a call that reads or changes saved state (profiles, watches, the configured storage):
        a clear 503 while another cluster holds the name or saved state is not restored yet."""
        await self._ensure_started()
        if self._refusal is not None:
            raise self._refusal
        if not self._restored:
            raise RestoringError(
                f"the rayprof controller has not restored its saved state from {self._home.uri} yet "
                f"({self._restore_error}); it retries every {RESTORE_RETRY_S:g}s: try again shortly"
            )

    async def _restore(self) -> bool:
        """Take the cluster name's lease, read saved settings, profiles and watches, then adopt them
        all at once and resume the unfinished ones. False when any step failed: then nothing was
        adopted, and the next attempt starts over."""
        try:
            await self._lease.acquire(self._settings().cluster_name_lease_s)
            configured = await self._persistence.load_config()
            loaded = await self._catalog.load()
            watches = await self._persistence.load_watches()
        except ClusterNameInUseError as e:
            self._refusal = e
            logger.error("rayprof controller: refusing to start: %s", e)
            return False
        except Exception as e:  # whatever failed, nothing was adopted: the retry starts over
            self._restore_error = f"{type(e).__name__}: {e}"
            logger.warning("rayprof controller: cannot read saved state (will retry): %s", self._restore_error)
            return False
        self._refusal = None
        self._spawn(self._hold_lease())
        # Adopted at once; from here on no step raises, so every unfinished profile is resumed or finished.
        if configured is not None:
            self._settings.use_storage(configured)
        unfinished = self._catalog.adopt(loaded)
        self._watches.restore(watches)
        self._watches.recover(self._catalog.triggered())
        self._intake.keys.restore(
            [(e.submit_key, e.id, e.summary.created_at) for e in loaded.finished.values()]
            + [(p.submit_key, p.id, p.created_at) for p in unfinished if isinstance(p, Profile)]
        )
        for profile in unfinished:
            await self._adopt_manifest(profile)
            if profile.state.is_terminal:
                await self._catalog.finish(profile)
            else:
                logger.info("rayprof controller: resuming %s in state %s", profile.id, profile.state.value)
                self._intake.start(profile)
        # Only now: a submit must find the resumed profiles queued on their targets.
        self._restored = True
        await self._catalog.settle(loaded)
        await self._resume_checks()
        await self._retention.enforce(self._catalog)
        return True

    async def _resume_checks(self) -> None:
        """Post-window checks that were in progress at the restart: followed again (or ended), never
        left pending. Never raises: a record that cannot be read keeps its saved check."""
        for profile_id in self._catalog.awaiting_checks():
            try:
                self._telemetry.resume_check(await self._catalog.profile(profile_id))
            except Exception as e:
                logger.warning("rayprof controller: cannot resume the post-window check of %s: %s", profile_id, e)

    async def _retry_restore(self) -> None:
        while not await self._restore():
            await asyncio.sleep(RESTORE_RETRY_S)

    async def _hold_lease(self) -> None:
        self._refusal = await self._lease.keep(self._settings().cluster_name_lease_s)
        logger.error("rayprof controller: lost the lease on its cluster name; serving nothing: %s", self._refusal)

    async def _adopt_manifest(self, profile: Profile) -> None:
        """Finish a restored profile whose manifest, the commit point, was written before the restart:
        ended at the commit point like every other profile (its state saved, its owner lease removed),
        without writing the manifest again. Never raises: a manifest that cannot be read leaves the
        profile to run on (it ends by its timeout)."""
        try:
            manifest = await self._persistence.stored_manifest(profile)
            if manifest is None:
                return
            profile.ranks = {r.rank: r for r in manifest.ranks}
            profile.manifest = manifest
            profile.manifest_uri = open_storage(profile.storage).uri(manifest_key(profile.target, profile.id))
            profile.finished_at = manifest.finished_at
            await self._commit.end(profile, manifest.status, manifest.reason, manifest=None)
        except Exception as e:  # a storage or a parse error alike: the profile runs on
            logger.warning("rayprof controller: cannot adopt the manifest of %s: %s", profile.id, e)
