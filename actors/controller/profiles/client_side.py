"""The client side of the control actor for one profile: read it, wait on it, cancel or delete it.

Each HTTP request on a profile is answered by one of these in one call: ``read`` (status and,
once it ended with one, manifest), ``report_html`` (the report's bytes, read from storage here) and
``remove`` (DELETE's policy: delete a finished profile, cancel a running one).
"""

from __future__ import annotations

import asyncio

from actors.controller.agents.registry import Registry
from actors.controller.clock import Clock
from actors.controller.diagnosis.watches import Watches
from actors.controller.profiles.state import Profile, wait_event
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.persistence import Persistence
from actors.controller.saved.retention import Retention
from orchestrator.errors import NotFoundError, ProfileNotFoundError
from orchestrator.manifest import read_artifact
from orchestrator.models.agent_protocol import CancelCommand, StorageSpec
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.reads import ProfileRead
from orchestrator.models.requests import ProfileState, RankState
from orchestrator.models.summaries import ProfilePage
from orchestrator.storage import open_storage

__all__ = ["ClientSide"]

# A window in these states opens or fills only as the run's ranks step.
_WAITING_FOR_STEPS = frozenset({ProfileState.PENDING, ProfileState.SCHEDULED, ProfileState.CAPTURING})


class ClientSide:
    """Methods clients call about one profile (and the list); mixed into :class:`actors.controller.actor.Controller`."""

    _registry: Registry
    _persistence: Persistence
    _catalog: Catalog
    _retention: Retention
    _watches: Watches
    _clock: Clock

    async def _restored_state(self) -> None:
        raise NotImplementedError

    async def get(self, profile_id: str) -> ProfileStatus:
        """Current status of one profile."""
        await self._restored_state()
        return self._said_stalled((await self._catalog.profile(profile_id)).snapshot())

    async def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        """Status once the profile changes state or ends, or after ``timeout_s``."""
        await self._restored_state()
        profile = await self._catalog.profile(profile_id)
        if not profile.state.is_terminal:
            profile.changed.clear()
            await wait_event(profile.changed, max(0.0, min(timeout_s, 60.0)))
        return self._said_stalled(profile.snapshot())

    def _said_stalled(self, status: ProfileStatus) -> ProfileStatus:
        """A window waiting on a run that has STALLED says so: it opens only once the run moves again, and
        until then nothing else in its status changes (every rank ARMED at 0 steps, then the timeout)."""
        if status.kind != "profile" or status.state not in _WAITING_FOR_STEPS or status.reason:
            return status
        workers = self._registry.run_workers(status.target, status.run)
        health = self._watches.assess(workers, self._clock.monotonic())
        if not health.stalled:
            return status
        reason = (
            f"{status.target} is STALLED: no rank has advanced for {health.stalled_s:.0f}s, so the window opens only "
            "once it moves again; every rank's stacks show where it is"
        )
        return status.model_copy(update={"reason": reason})

    async def read(self, profile_id: str, wait_s: float = 0.0) -> ProfileRead:
        """Status (after a long-poll of ``wait_s`` when positive) with the manifest once it ended with one."""
        return await self._with_manifest(await (self.wait(profile_id, wait_s) if wait_s > 0 else self.get(profile_id)))

    async def _with_manifest(self, status: ProfileStatus) -> ProfileRead:
        manifest = None
        if status.state.is_terminal and status.manifest_uri is not None:
            manifest = await self.manifest(status.id)
        return ProfileRead(status=status, manifest=manifest)

    async def list(
        self, target: str | None = None, state: ProfileState | None = None, limit: int = 100, offset: int = 0
    ) -> ProfilePage:
        """One page of profile summaries, newest first, optionally filtered."""
        await self._restored_state()
        return self._catalog.page(target, state, limit, offset)

    async def cancel(self, profile_id: str) -> ProfileStatus:
        """Stop a profile: armed and capturing ranks drop their window."""
        await self._restored_state()
        profile = await self._catalog.profile(profile_id)
        if profile.state.is_terminal or not isinstance(profile, Profile):  # a bundle ends on its own
            return profile.snapshot()
        profile.cancel_requested = True
        # The window is set as the arms go out: from then on a WAITING rank may hold an
        # armed window whose ARMED has not arrived yet, and only a cancel closes it.
        arms_sent = profile.window is not None
        for rank, result in profile.ranks.items():
            if result.state.is_terminal:
                continue
            worker = self._registry.workers.get(profile.agents.get(rank, ""))
            if arms_sent and worker is not None:
                worker.send(CancelCommand(profile_id=profile.id))
            elif result.state == RankState.WAITING:
                profile.ranks[rank] = result.model_copy(
                    update={"state": RankState.CANCELLED, "reason": "cancelled before the window was armed"}
                )
        profile.changed.set()
        # Saved, so a restart goes on cancelling instead of resuming the window.
        await self._persistence.save(profile)
        return profile.snapshot()

    async def delete(self, profile_id: str) -> None:
        """Delete a finished profile: its folder in storage and its saved state."""
        await self._restored_state()
        await self._retention.delete(await self._catalog.ended(profile_id))
        self._catalog.remove(profile_id)
        await self._catalog.save_index()

    async def remove(self, profile_id: str) -> ProfileRead:
        """DELETE on a profile: a finished one is deleted (answered as it was, ``deleted``), a
        running one cancelled (answered as ``read`` would)."""
        status = await self.get(profile_id)
        if status.state.is_terminal:
            await self.delete(profile_id)
            return ProfileRead(status=status, deleted=True)
        return await self._with_manifest(await self.cancel(profile_id))

    async def manifest(self, profile_id: str) -> Manifest:
        """The stored manifest of a finished profile."""
        await self._restored_state()
        profile = await self._catalog.profile(profile_id)
        if profile.manifest is not None:
            return profile.manifest
        if profile.manifest_uri is None:
            raise ProfileNotFoundError(
                f"profile {profile_id} has no manifest yet (state {profile.state.value})", profile_id=profile_id
            )
        profile.manifest = await self._persistence.read_manifest(profile)
        return profile.manifest

    async def report_html(self, profile_id: str) -> bytes:
        """The analysis report (``report.html``) its manifest lists, checked against its checksum."""
        manifest = await self.manifest(profile_id)
        report = next((a for a in manifest.artifacts if a.kind == "report"), None)
        if report is None:
            raise NotFoundError(
                f"profile {profile_id} has no report: its manifest lists no artifact of kind 'report'",
                profile_id=profile_id,
            )
        storage = open_storage(self._catalog.storage_of(profile_id))
        return await asyncio.to_thread(read_artifact, storage, manifest, report.key, report.sha256)

    async def profile_storage(self, profile_id: str) -> StorageSpec:
        """Where a profile's files are: the storage its record names. After the storage is reconfigured
        (``rayprof serve --storage NEW``) earlier profiles stay where they were written."""
        await self._restored_state()
        return self._catalog.storage_of(profile_id)
