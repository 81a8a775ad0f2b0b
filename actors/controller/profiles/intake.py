"""A profile request taken in: checked, reserved, saved, then run on its target's line to the end.

``submit`` answers once the profile is saved (so a profile a caller was told about survives a
restart) and runs it in the background; a retry with the same submit key gets the first try's
profile. ``start`` runs a restored profile the same way, and a watch submits through here too.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from actors.controller.agents.registry import Registry
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.live_config import LiveConfig
from actors.controller.monitoring.telemetry import Telemetry
from actors.controller.profiles.idempotency import SubmitKey, SubmitKeys
from actors.controller.profiles.planning import validate
from actors.controller.profiles.runner import Runner
from actors.controller.profiles.state import Profile
from actors.controller.profiles.target_queue import TargetQueue
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.leases import Leases
from actors.controller.saved.persistence import Persistence
from actors.controller.saved.retention import Retention
from orchestrator.layout import profile_id as new_profile_id
from orchestrator.models.profile import ProfileStatus, Trigger
from orchestrator.models.requests import ProfileRequest

__all__ = ["Intake"]

Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task]


class Intake:
    def __init__(
        self,
        config: LiveConfig,
        registry: Registry,
        catalog: Catalog,
        queue: TargetQueue,
        persistence: Persistence,
        leases: Leases,
        runner: Runner,
        telemetry: Telemetry,
        retention: Retention,
        spawn: Spawn,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._config = config
        self._clock = clock
        self._registry = registry
        self._catalog = catalog
        self._queue = queue
        self._persistence = persistence
        self._leases = leases
        self._runner = runner
        self._telemetry = telemetry
        self._retention = retention
        self._spawn = spawn
        self.keys = SubmitKeys(clock)
        # Submits reserved and being saved, by profile id: a retry with the same key waits for the save.
        self._accepting: dict[str, asyncio.Task] = {}
        # Real time, not the injected clock: this wait is for agents to come back, which no test steps.
        self._started_at = time.monotonic()

    async def submit(
        self, request: ProfileRequest, trigger: Trigger | None = None, key: SubmitKey | None = None
    ) -> ProfileStatus:
        """Check and reserve ``request``, save it, run it in the background; its status as saved."""
        await self.await_target(request.target)
        # No await from here to the reservation: concurrent submits see each other's keys and slots.
        made = self.keys.find(key, self._catalog.__contains__) if key is not None else None
        if made is not None:
            if made in self._accepting:
                await asyncio.shield(self._accepting[made])
            return (await self._catalog.profile(made)).snapshot()
        config = self._config()
        workers = self._registry.run_workers(request.target, request.run)
        world_size = max((w.info.world_size for w in workers.values()), default=None)
        validate(request, config, world_size, self._registry.names())
        self._queue.admit(request)
        now = self._clock.wall()
        new_id = new_profile_id("prof", now, uuid.uuid4().hex[:8])
        profile = Profile(
            id=new_id, request=request, storage=config.storage, run=request.run, trigger=trigger, submit_key=key, created_at=now
        )
        # Reserved before the save: the limits above count it, and a retry finds its key.
        self._catalog.live[profile.id] = profile
        self._queue.join(profile)
        if key is not None:
            self.keys.remember(key, profile.id, profile.created_at)
        accepting = self._accepting[profile.id] = self._spawn(self._accept(profile))
        # Shielded: a caller that goes away mid-save leaves no saved profile that never runs.
        await asyncio.shield(accepting)
        return profile.snapshot()

    async def _accept(self, profile: Profile) -> None:
        """Save a reserved profile, then run it; a profile that cannot be saved is released."""
        try:
            # Saved before it is accepted: a profile the caller was told about survives a restart.
            await self._persistence.save(profile)
            # Before any rank writes to its folder: another cluster's gc keeps a folder with a live owner.
            await self._leases.hold(profile)
        except BaseException:
            self._catalog.live.pop(profile.id, None)
            self._queue.leave(profile)
            self._persistence.forget(profile.id)
            if profile.submit_key is not None:
                self.keys.forget(profile.submit_key, profile.id)
            raise
        finally:
            del self._accepting[profile.id]
        self._spawn(self._run(profile))

    def start(self, profile: Profile) -> None:
        """Run a restored profile on its target's line."""
        # Queue synchronously so a second submit sees this one at once.
        self._queue.join(profile)
        self._spawn(self._run(profile))

    async def _run(self, profile: Profile) -> None:
        await self._queue.run(profile, self._runner.run)
        await self._catalog.finish(profile)
        self._telemetry.bundle_ended(profile)
        await self._retention.enforce(self._catalog)

    async def await_target(self, target: str) -> None:
        """Give an unknown target until a worker's expiry after this controller started: after a
        restart, agents (or their node's relay) notice and re-register within that, and would
        otherwise get a 404."""
        config = self._config()
        until = self._started_at + config.poll_timeout_s + config.worker_expiry_grace_s
        while not self._registry.runs(target) and time.monotonic() < until:
            await asyncio.sleep(0.05)
