"""Every rank's stacks in one call: fan out, wait, group, store like a profile.

The controller sends each live rank of the target's newest run a ``stacks``
command; the agent answers from its own thread (works while training is
blocked in a collective). Identical training-thread stacks collapse into rank
ranges, ranks unlike the majority come first, ranks that did not answer are
listed with why. The bundle is stored as a profile folder of kind
``stacks`` (``stacks/rank{R}.txt``, ``stacks.json``, manifest last) and listed
with profiles.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.controller.persistence import Persistence
from actors.controller.registry import Registry, Worker
from actors.controller.stack_groups import (
    collective_notes,
    group_stacks,
    rank_text,
    summary_line,
)
from actors.controller.state import Profile, wait_event
from orchestrator.config import normalize_uri
from orchestrator.control import ControllerConfig
from orchestrator.diagnosis import MissingRank, RankStacks, StacksBundle
from orchestrator.errors import StorageError, TargetNotFoundError
from orchestrator.layout import STACKS_NAME, profile_prefix, rank_stacks_keys
from orchestrator.layout import profile_id as new_profile_id
from orchestrator.models import (
    Artifact,
    Command,
    Manifest,
    ProfileRequest,
    ProfileState,
    RankResult,
    RankState,
    Trigger,
    utcnow,
)
from orchestrator.storage import Storage, open_storage

__all__ = ["StacksTaker"]

logger = logging.getLogger(__name__)

# Files written at once; S3 puts are slow one by one, and a bundle can have a thousand ranks.
_WRITERS = 16


@dataclass
class _Pending:
    expected: dict[str, int]
    answers: dict[int, RankStacks] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class StacksTaker:
    """Takes, groups and stores stacks bundles; one per controller."""

    def __init__(
        self,
        registry: Registry,
        persistence: Persistence,
        config: Callable[[], ControllerConfig],
        profiles: dict[str, Profile],
    ) -> None:
        self._registry = registry
        self._persistence = persistence
        self._config = config
        self._profiles = profiles
        self._pending: dict[str, _Pending] = {}

    def receive(self, reply: RankStacks) -> None:
        """An agent's answer; late, unknown or duplicate answers are dropped."""
        pending = self._pending.get(reply.bundle_id)
        if pending is None or reply.agent_id not in pending.expected:
            return
        pending.answers[pending.expected[reply.agent_id]] = reply
        pending.arrived.set()

    async def take(
        self, target: str, run: str | None = None, native: bool = False, trigger: Trigger | None = None
    ) -> StacksBundle:
        """Stacks of every live rank of ``target``'s newest run (or ``run``), stored and grouped."""
        config = self._config()
        workers = self._registry.run_workers(target, run)
        if not workers:
            raise TargetNotFoundError(
                f"no live training run named {target!r}; known targets: {self._registry.names() or 'none'}",
                target=target,
            )
        run = next(iter(workers.values())).run
        bundle_id = new_profile_id("stk", utcnow(), uuid.uuid4().hex[:8])
        storage = config.storage
        profile = Profile(
            id=bundle_id,
            request=ProfileRequest(target=target, steps=1),
            storage=storage,
            storage_uri=f"{normalize_uri(storage.uri)}/{target}/{bundle_id}",
            run=run,
            kind="stacks",
            trigger=trigger,
        )
        self._profiles[bundle_id] = profile
        taken_at = utcnow()
        answers, missing = await self._collect(bundle_id, workers, native, config.stacks_timeout_s)
        return await self._store(profile, workers, answers, missing, native, taken_at)

    async def _collect(
        self, bundle_id: str, workers: dict[int, Worker], native: bool, timeout_s: float
    ) -> tuple[dict[int, RankStacks], list[MissingRank]]:
        pending = _Pending(expected={w.info.agent_id: rank for rank, w in workers.items()})
        self._pending[bundle_id] = pending
        sent = time.monotonic()
        try:
            for worker in workers.values():
                worker.send(Command(kind="stacks", profile_id=bundle_id, native=native))
            deadline = sent + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                unanswered = [a for a, rank in pending.expected.items() if rank not in pending.answers]
                # Done once every rank answered or its worker is gone: nobody else will answer.
                if all(a not in self._registry.workers for a in unanswered):
                    break
                pending.arrived.clear()
                await wait_event(pending.arrived, min(left, 0.5))
        finally:
            self._pending.pop(bundle_id, None)
        world_size = max(w.info.world_size for w in workers.values())
        now = time.monotonic()
        missing = [MissingRank(rank=r, reason="no agent registered for this rank") for r in range(world_size) if r not in workers]
        for rank, worker in workers.items():
            if rank in pending.answers:
                continue
            if worker.info.agent_id not in self._registry.workers:
                reason = "the worker went away while its stacks were asked for (process exited or restarted)"
            else:
                reason = (
                    f"no answer within {timeout_s:g}s (last heartbeat {now - worker.seen_at:.0f}s ago): the agent's "
                    "thread may be blocked by a call that holds the GIL"
                )
            missing.append(MissingRank(rank=rank, reason=reason))
        missing.sort(key=lambda m: m.rank)
        return pending.answers, missing

    async def _store(
        self,
        profile: Profile,
        workers: dict[int, Worker],
        answers: dict[int, RankStacks],
        missing: list[MissingRank],
        native: bool,
        taken_at: object,
    ) -> StacksBundle:
        groups = group_stacks(answers)
        fr_notes = {s.flight_recorder_note for s in answers.values() if s.flight_recorder_note and not s.collectives}
        state = ProfileState.DONE if not missing else ProfileState.PARTIAL if answers else ProfileState.FAILED
        bundle = StacksBundle(
            id=profile.id,
            target=profile.target,
            run=profile.run,
            state=state,
            summary=summary_line(groups, missing),
            groups=groups,
            missing=missing,
            collectives=collective_notes(answers),
            flight_recorder_note=sorted(fr_notes)[0] if fr_notes and not any(s.collectives for s in answers.values()) else None,
            native_notes=sorted({s.native_note for s in answers.values() if s.native_note}) if native else [],
            storage_uri=profile.storage_uri,
            trigger=profile.trigger,
            taken_at=taken_at,
            finished_at=utcnow(),
        )
        storage = open_storage(profile.storage)
        prefix = profile_prefix(profile.target, profile.id)
        try:
            rank_files = await self._write_ranks(storage, prefix, workers, answers)
            summary = await asyncio.to_thread(
                storage.put_bytes,
                bundle.model_dump_json(indent=2).encode(),
                f"{prefix}/{STACKS_NAME}",
                "stacks_summary",
                folder=prefix,
            )
        except StorageError as e:
            return await self._end(profile, bundle, ProfileState.FAILED, f"could not store the stacks: {e}", [], {})
        return await self._end(profile, bundle, state, bundle.summary if missing else None, [summary], rank_files)

    async def _write_ranks(
        self, storage: Storage, prefix: str, workers: dict[int, Worker], answers: dict[int, RankStacks]
    ) -> dict[int, list[Artifact]]:
        gate = asyncio.Semaphore(_WRITERS)

        async def one(rank: int, stacks: RankStacks) -> tuple[int, list[Artifact]]:
            keys = rank_stacks_keys(prefix, rank)
            async with gate:
                text = rank_text(rank, workers[rank].info, stacks)
                written = [await asyncio.to_thread(storage.put_bytes, text.encode(), keys["stacks"], "stacks", folder=prefix)]
                if stacks.flight_recorder:
                    written.append(
                        await asyncio.to_thread(
                            storage.put_bytes,
                            stacks.flight_recorder.encode(),
                            keys["flight_recorder"],
                            "flight_recorder",
                            folder=prefix,
                        )
                    )
            return rank, written

        return dict(await asyncio.gather(*(one(r, s) for r, s in answers.items())))

    async def _end(
        self,
        profile: Profile,
        bundle: StacksBundle,
        state: ProfileState,
        reason: str | None,
        artifacts: list[Artifact],
        rank_files: dict[int, list[Artifact]],
    ) -> StacksBundle:
        """Write the manifest (the commit point), then record and save the terminal state."""
        finished = utcnow()
        missing = {m.rank: m.reason for m in bundle.missing}
        for rank in sorted(set(rank_files) | set(missing) | {r for g in bundle.groups for r in g.ranks}):
            profile.ranks[rank] = RankResult(
                rank=rank,
                state=RankState.FAILED if rank in missing else RankState.DONE,
                reason=missing.get(rank),
                artifacts=rank_files.get(rank, []),
                finished_at=finished,
            )
        manifest = Manifest(
            profile_id=profile.id,
            kind="stacks",
            target=profile.target,
            status=state,
            reason=reason,
            request=profile.request,
            storage_uri=profile.storage_uri,
            start_step=None,
            stop_step=None,
            ranks=[profile.ranks[r] for r in sorted(profile.ranks)],
            artifacts=artifacts,
            requested_at=profile.created_at,
            finished_at=finished,
            summary={"stacks": bundle.summary},
            trigger=profile.trigger,
        )
        if state != ProfileState.FAILED:
            try:
                profile.manifest_uri = await self._persistence.write_manifest(profile, manifest)
                profile.manifest = manifest
            except StorageError as e:
                state, reason = ProfileState.FAILED, f"could not write the manifest: {e}"
        profile.reason = reason
        profile.finished_at = finished
        profile.transition(state)
        try:
            await self._persistence.save(profile)
        except StorageError as e:
            logger.warning("rayprof controller: cannot save %s: %s", profile.id, e)
        logger.info("rayprof controller: stacks %s of %s: %s", profile.id, profile.target, bundle.summary)
        return bundle.model_copy(update={"state": state, "manifest_uri": profile.manifest_uri})
