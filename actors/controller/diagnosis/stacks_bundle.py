"""Every rank's stacks in one call: fan out, wait, group, store like a profile.

The controller sends each live rank of the target's newest run a ``stacks``
command; the agent answers from its own thread (works while training is
blocked in a collective). Identical training-thread stacks collapse into rank
ranges, ranks unlike the majority come first, ranks that did not answer are
listed with why. The bundle is stored as a profile folder of kind
``stacks`` (``stacks/rank{R}.txt``, ``stacks.json``, manifest last) and listed
with profiles.

Each answer is re-validated (its text made valid UTF-8), cut to
``RAYPROF_STACKS_MAX_RANK_BYTES`` and written as it arrives; only a small
digest of it stays in memory. Whatever a rank sends, a bundle ends (DONE,
PARTIAL or FAILED): an answer that cannot be read or stored makes that rank
missing, with why.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.controller.agents.registry import Registry, Worker
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.diagnosis.stack_groups import (
    RankDigest,
    collective_notes,
    digest,
    group_stacks,
    rank_text,
    summary_line,
)
from actors.controller.profiles.commit import Commit
from actors.controller.profiles.state import StacksRecord, wait_event
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.leases import Leases
from orchestrator.errors import StorageError, TargetNotFoundError
from orchestrator.layout import STACKS_NAME, profile_prefix, rank_artifact_keys, rank_stacks_keys
from orchestrator.layout import profile_id as new_profile_id
from orchestrator.models.agent_protocol import SnapshotDestination, StacksCommand
from orchestrator.models.control import ControllerConfig, known_targets
from orchestrator.models.diagnosis import Frame, MissingRank, RankNote, RankStacks, StacksBundle, safe_text
from orchestrator.models.profile import Artifact, RankResult, StacksSummary, Trigger
from orchestrator.models.requests import ProfileState, RankState
from orchestrator.stack_limits import bound_stacks
from orchestrator.storage import Storage, open_storage

__all__ = ["StacksTaker"]

logger = logging.getLogger(__name__)

# Files written at once; S3 puts are slow one by one, and a bundle can have a thousand ranks.
_WRITERS = 16


@dataclass
class _Pending:
    """One bundle being taken: what each rank's answer left behind once stored."""

    profile: StacksRecord
    workers: dict[int, Worker]
    storage: Storage
    max_bytes: int
    expected: dict[str, int]
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(_WRITERS))
    answered: set[int] = field(default_factory=set)
    digests: dict[int, RankDigest] = field(default_factory=dict)
    files: dict[int, list[Artifact]] = field(default_factory=dict)
    # Ranks that answered with something that could not be read or stored, and why.
    unusable: dict[int, str] = field(default_factory=dict)
    writes: set[asyncio.Task] = field(default_factory=set)
    shared: dict[tuple[tuple[str, int, str], ...], tuple[Frame, ...]] = field(default_factory=dict)
    # Why a rank asked for its memory snapshot has none.
    memory_notes: dict[int, str] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prefix(self) -> str:
        return profile_prefix(self.profile.target, self.profile.id)


class StacksTaker:
    """Takes, groups and stores stacks bundles; one per controller."""

    def __init__(
        self,
        registry: Registry,
        commit: Commit,
        config: Callable[[], ControllerConfig],
        catalog: Catalog,
        leases: Leases,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._commit = commit
        self._config = config
        self._catalog = catalog
        self._leases = leases
        self._pending: dict[str, _Pending] = {}

    async def receive(self, reply: RankStacks) -> None:
        """An agent's answer, stored before this returns (so a thousand ranks answering at once
        wait on the writers instead of piling up here); late, unknown or duplicate answers are dropped."""
        pending = self._pending.get(reply.bundle_id)
        rank = pending.expected.get(reply.agent_id) if pending is not None else None
        if pending is None or rank is None or rank in pending.answered:
            return
        pending.answered.add(rank)
        task = asyncio.ensure_future(self._keep(pending, rank, reply))
        pending.writes.add(task)
        pending.arrived.set()
        # Shielded: an agent's dropped call must not cut a write the bundle waits for.
        await asyncio.shield(task)

    async def _keep(self, pending: _Pending, rank: int, reply: RankStacks) -> None:
        """Store one rank's answer and keep its digest; a failure makes the rank missing, with why."""
        put = pending.storage.put_bytes
        keys = rank_stacks_keys(rank)
        try:
            # Under the gate: the copies made here exist for at most _WRITERS answers at once.
            async with pending.gate:
                # Re-validated: an answer arrives unpickled, never checked; this makes its text valid UTF-8.
                stacks = bound_stacks(RankStacks.model_validate(reply.model_dump(warnings=False)), pending.max_bytes)
                text = rank_text(rank, pending.workers[rank].info, stacks).encode()
                files = [await asyncio.to_thread(put, text, keys["stacks"], "stacks")]
                del text
                if stacks.flight_recorder:
                    dump = stacks.flight_recorder.encode()
                    files.append(
                        await asyncio.to_thread(put, dump, keys["flight_recorder"], "flight_recorder")
                    )
                pending.digests[rank] = digest(stacks, pending.shared)
                pending.files[rank] = files + _snapshot_files(rank, reply.artifacts)
                if reply.memory_note:
                    pending.memory_notes[rank] = reply.memory_note
        except StorageError as e:
            pending.unusable[rank] = safe_text(f"its answer could not be stored: {e}")
        except Exception as e:
            logger.warning("rayprof controller: unreadable stacks from rank %d of %s: %r", rank, pending.profile.id, e)
            pending.unusable[rank] = safe_text(f"its answer could not be read: {type(e).__name__}: {e}")

    async def take(
        self,
        target: str,
        run: str | None = None,
        native: bool = False,
        trigger: Trigger | None = None,
        memory: bool = False,
    ) -> StacksBundle:
        """Stacks of every live rank of ``target``'s newest run (or ``run``), stored and grouped;
        with ``memory``, each rank's CUDA allocator snapshot beside its stacks (an OOM watch's bundle).
        Once the bundle exists it always ends: an unexpected error ends it FAILED, with why."""
        config = self._config()
        workers = self._registry.run_workers(target, run)
        if not workers:
            raise TargetNotFoundError(
                f"no live training run named {target!r}; known targets: {known_targets(self._registry.names())}",
                target=target,
            )
        run = next(iter(workers.values())).run
        bundle_id = new_profile_id("stk", self._clock.wall(), uuid.uuid4().hex[:8])
        storage = config.storage
        profile = StacksRecord(id=bundle_id, target=target, storage=storage, run=run, trigger=trigger)
        self._catalog.add(profile)
        taken_at = self._clock.wall()
        pending = _Pending(
            profile=profile,
            workers=workers,
            storage=open_storage(storage).scoped(profile_prefix(target, bundle_id)),
            max_bytes=config.stacks_max_rank_bytes,
            expected={w.info.agent_id: rank for rank, w in workers.items()},
        )
        try:
            await self._leases.hold(profile)
            missing = await self._collect(pending, native, config.stacks_timeout_s, memory)
            return await self._store(pending, missing, native, taken_at)
        except Exception as e:
            logger.exception("rayprof controller: stacks %s failed", bundle_id)
            bundle = _bundle_of(
                profile,
                state=profile.state if profile.state.is_terminal else ProfileState.FAILED,
                summary="the stacks could not be taken",
                groups=[],
                taken_at=taken_at,
                finished_at=self._clock.wall(),
            )
            if profile.state.is_terminal:  # it had ended: what failed came after
                return bundle
            reason = safe_text(f"the stacks could not be taken: {type(e).__name__}: {e}")
            return await self._end(profile, bundle, ProfileState.FAILED, reason, [], {})

    async def _collect(self, pending: _Pending, native: bool, timeout_s: float, memory: bool) -> list[MissingRank]:
        """Ask every rank, wait for the answers (and their writes); returns the ranks missing, with why."""
        bundle_id = pending.profile.id
        workers = pending.workers
        self._pending[bundle_id] = pending
        # Real time, not the injected clock, for the wait itself: the answers come from agents, and a
        # stepped clock nobody moves must not hold a bundle open (the heartbeat age below is the registry's).
        sent = time.monotonic()
        config = self._config()
        expiry_s = config.poll_timeout_s + config.worker_expiry_grace_s
        command = StacksCommand(
            profile_id=bundle_id,
            native=native,
            max_bytes=pending.max_bytes,
            memory=SnapshotDestination(storage=pending.profile.storage, prefix=pending.prefix) if memory else None,
        )
        try:
            for worker in workers.values():
                worker.send(command)
            deadline = sent + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                unanswered = [a for a, rank in pending.expected.items() if rank not in pending.answered]
                # Done once every rank answered or its worker is gone: nobody else will answer. A worker
                # dropped on expiry within one expiry may only have gone silent: it registers again at its
                # next call, and gets its command then.
                if all(a not in self._registry.workers and not self._registry.may_return(a, expiry_s) for a in unanswered):
                    break
                pending.arrived.clear()
                await wait_event(pending.arrived, min(left, 0.5))
        finally:
            self._pending.pop(bundle_id, None)
        # Answers in hand are stored before the bundle is: the manifest lists every file written.
        await asyncio.gather(*pending.writes, return_exceptions=True)
        world_size = max(w.info.world_size for w in workers.values())
        now = self._clock.monotonic()  # the clock the registry dates heartbeats by
        missing = [MissingRank(rank=r, reason="no agent registered for this rank") for r in range(world_size) if r not in workers]
        missing += [MissingRank(rank=r, reason=why) for r, why in pending.unusable.items()]
        for rank, worker in workers.items():
            if rank in pending.answered:
                continue
            current = self._registry.workers.get(worker.info.agent_id)  # re-registered: a new record
            if current is None:
                why = self._registry.why_gone(worker.info.agent_id) or "its process exited or restarted"
                reason = f"the worker went away while its stacks were asked for: {why}"
            else:
                reason = (
                    f"no answer within {timeout_s:g}s (last heartbeat {now - current.seen_at:.0f}s ago): the agent's "
                    "thread may be blocked by a call that holds the GIL"
                )
            missing.append(MissingRank(rank=rank, reason=reason))
        missing.sort(key=lambda m: m.rank)
        return missing

    async def _store(
        self, pending: _Pending, missing: list[MissingRank], native: bool, taken_at: object
    ) -> StacksBundle:
        profile, digests = pending.profile, pending.digests
        groups = group_stacks(digests)
        fr_notes = {d.flight_recorder_note for d in digests.values() if d.flight_recorder_note and not d.latest}
        any_collectives = any(d.latest for d in digests.values())
        state = ProfileState.DONE if not missing else ProfileState.PARTIAL if digests else ProfileState.FAILED
        bundle = _bundle_of(
            profile,
            state=state,
            summary=summary_line(groups, missing),
            groups=groups,
            missing=missing,
            truncated=[RankNote(rank=r, note=d.truncated) for r, d in sorted(digests.items()) if d.truncated],
            collectives=collective_notes(digests),
            flight_recorder_note=sorted(fr_notes)[0] if fr_notes and not any_collectives else None,
            native_notes=sorted({d.native_note for d in digests.values() if d.native_note}) if native else [],
            memory_notes=[RankNote(rank=r, note=n) for r, n in sorted(pending.memory_notes.items())],
            taken_at=taken_at,
            finished_at=self._clock.wall(),
        )
        try:
            summary = await asyncio.to_thread(
                pending.storage.put_bytes,
                bundle.model_dump_json(indent=2).encode(),
                STACKS_NAME,
                "stacks_summary",
            )
        except StorageError as e:
            return await self._end(profile, bundle, ProfileState.FAILED, f"could not store the stacks: {e}", [], {})
        return await self._end(profile, bundle, state, bundle.summary if missing else None, [summary], pending.files)

    async def _end(
        self,
        profile: StacksRecord,
        bundle: StacksBundle,
        state: ProfileState,
        reason: str | None,
        artifacts: list[Artifact],
        rank_files: dict[int, list[Artifact]],
    ) -> StacksBundle:
        """Record every rank's files and make the manifest, then end the bundle at the commit point."""
        finished = self._clock.wall()
        missing = {m.rank: m.reason for m in bundle.missing}
        for rank in sorted(set(rank_files) | set(missing) | {r for g in bundle.groups for r in g.ranks}):
            profile.ranks[rank] = RankResult(
                rank=rank,
                state=RankState.FAILED if rank in missing else RankState.DONE,
                reason=missing.get(rank),
                artifacts=rank_files.get(rank, []),
                finished_at=finished,
            )
        profile.finished_at = finished
        summary = StacksSummary(line=bundle.summary, groups=len(bundle.groups), missing=sorted(missing))
        manifest = profile.manifest_of(state, reason, artifacts=artifacts, summary=summary)
        # A failed bundle (no rank's stacks, or its stacks.json unstored) ends without a manifest.
        state = await self._commit.end(profile, state, reason, manifest if state != ProfileState.FAILED else None)
        logger.info("rayprof controller: stacks %s of %s: %s", profile.id, profile.target, bundle.summary)
        return bundle.model_copy(update={"state": state, "manifest_uri": profile.manifest_uri})


def _snapshot_files(rank: int, artifacts: list[Artifact]) -> list[Artifact]:
    """The snapshot files a rank says it stored: only its own two keys are listed (an answer is
    the agent's word, and the manifest lists nothing outside the rank's place in the bundle)."""
    keys = rank_artifact_keys(rank, host="", pid=0)
    own = {keys[kind]: kind for kind in ("memory_snapshot", "memory_view")}
    return [a for a in artifacts if own.get(a.key) == a.kind]


def _bundle_of(profile: StacksRecord, **fields: Any) -> StacksBundle:
    """The bundle as its caller gets it: what the record says of the bundle itself, and ``fields``."""
    return StacksBundle(
        id=profile.id, run=profile.run, storage_uri=profile.storage_uri, target=profile.target, trigger=profile.trigger, **fields
    )
