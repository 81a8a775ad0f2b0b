"""The control actor: registry of training workers and the life of each profile request.

A named, detached, async Ray actor (``rayprof-controller`` in namespace
``rayprof``). Agents long-poll it; clients submit, watch and cancel profiles.
Every state change of a profile is persisted to storage so a restarted
controller picks up where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.postprocess import PostprocessResult, postprocess
from orchestrator.config import controller_config, normalize_uri
from orchestrator.errors import (
    ConflictError,
    InvalidRequestError,
    ProfileNotFoundError,
    RayprofError,
    TargetNotFoundError,
)
from orchestrator.layout import CONFIG_KEY, STATE_PREFIX, manifest_key, profile_prefix, state_key
from orchestrator.manifest import read_manifest, write_manifest
from orchestrator.models import (
    Command,
    ControllerConfig,
    Heartbeat,
    Manifest,
    ProfileRequest,
    ProfileState,
    ProfileStatus,
    RankEvent,
    RankResult,
    RankState,
    StorageSpec,
    TargetInfo,
    WindowSpec,
    WorkerInfo,
    WorkerStatus,
    utcnow,
)
from orchestrator.settings import CONTROLLER_NAME, CONTROLLER_NAMESPACE, MIN_LEAD_STEPS
from orchestrator.storage import open_storage

__all__ = ["Controller", "create_controller"]

logger = logging.getLogger(__name__)

_ARM_COST_PER_SYNC = 4.0
# Plan shortened windows this far under the byte cap: step sizes vary a little.
_CAP_MARGIN = 0.9


class _SavedProfile(BaseModel):
    """A profile as persisted in the controller's home storage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: ProfileStatus
    storage: StorageSpec


@dataclass
class _Worker:
    info: WorkerInfo
    step: int = 0
    step_time_s: float | None = None
    seen_at: float = field(default_factory=time.monotonic)
    commands: deque[Command] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, command: Command) -> None:
        self.commands.append(command)
        self.wake.set()

    def estimated_step(self, now: float) -> float:
        """Where this worker probably is now, extrapolated from its last heartbeat."""
        if not self.step_time_s:
            return float(self.step)
        return self.step + (now - self.seen_at) / self.step_time_s


@dataclass
class _Profile:
    id: str
    request: ProfileRequest
    storage: StorageSpec
    state: ProfileState = ProfileState.PENDING
    reason: str | None = None
    start_step: int | None = None
    steps: int | None = None
    manifest_uri: str | None = None
    ranks: dict[int, RankResult] = field(default_factory=dict)
    agents: dict[int, str] = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)
    scheduled_at: datetime | None = None
    capture_started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    deadline: float | None = None
    # Group commit: changes asked to be saved / changes saved, as counters.
    saves_asked: int = 0
    saves_done: int = 0

    @property
    def target(self) -> str:
        return self.request.target

    @property
    def prefix(self) -> str:
        return profile_prefix(self.target, self.id)

    @property
    def stop_step(self) -> int | None:
        return None if self.start_step is None or self.steps is None else self.start_step + self.steps

    def snapshot(self) -> ProfileStatus:
        return ProfileStatus(
            id=self.id,
            target=self.target,
            state=self.state,
            reason=self.reason,
            request=self.request,
            start_step=self.start_step,
            stop_step=self.stop_step,
            storage_uri=f"{normalize_uri(self.storage.uri)}/{self.prefix}",
            manifest_uri=self.manifest_uri,
            ranks=[self.ranks[r] for r in sorted(self.ranks)],
            created_at=self.created_at,
            scheduled_at=self.scheduled_at,
            capture_started_at=self.capture_started_at,
            finished_at=self.finished_at,
        )

    @classmethod
    def restore(cls, status: ProfileStatus, storage: StorageSpec) -> _Profile:
        return cls(
            id=status.id,
            request=status.request,
            storage=storage,
            state=status.state,
            reason=status.reason,
            start_step=status.start_step,
            steps=None if status.start_step is None or status.stop_step is None else status.stop_step - status.start_step,
            manifest_uri=status.manifest_uri,
            ranks={r.rank: r for r in status.ranks},
            created_at=status.created_at,
            scheduled_at=status.scheduled_at,
            capture_started_at=status.capture_started_at,
            finished_at=status.finished_at,
        )


class Controller:
    """Registry of targets and the state machine of every profile request."""

    def __init__(self, config: ControllerConfig) -> None:
        # Ray leaves an actor's root logger at WARNING; state changes are worth keeping.
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._config = config
        # State lives where the constructor's config points: a restarted actor
        # is constructed with the same config and finds it again.
        self._home = config.storage
        self._workers: dict[str, _Worker] = {}
        self._profiles: dict[str, _Profile] = {}
        self._slots: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, list[str]] = {}
        self._active: dict[str, str] = {}
        self._tasks: set[asyncio.Task] = set()
        self._persist_lock: asyncio.Lock | None = None
        self._ready: asyncio.Event | None = None
        self._started_at = time.monotonic()

    # ---- lifecycle -------------------------------------------------------

    async def _ensure_started(self) -> None:
        # Async actors have no async constructor; start background work on the
        # first call, and hold every call until saved state is restored.
        if self._ready is None:
            self._ready = asyncio.Event()
            self._persist_lock = asyncio.Lock()
            self._spawn(self._reap_workers())
            await self._restore()
            self._ready.set()
        await self._ready.wait()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _restore(self) -> None:
        storage = open_storage(self._home)
        try:
            if await asyncio.to_thread(storage.exists, CONFIG_KEY):
                configured = StorageSpec.model_validate_json(await asyncio.to_thread(storage.get_bytes, CONFIG_KEY))
                self._config = self._config.model_copy(update={"storage": configured})
            keys = await asyncio.to_thread(storage.list, STATE_PREFIX)
        except RayprofError as e:
            logger.warning("rayprof controller: cannot read saved state: %s", e)
            return
        for key in keys:
            try:
                saved = _SavedProfile.model_validate_json(await asyncio.to_thread(storage.get_bytes, key))
            except Exception as e:
                logger.warning("rayprof controller: skipping unreadable state %s: %s", key, e)
                continue
            profile = _Profile.restore(saved.status, saved.storage)
            self._profiles[profile.id] = profile
            if not profile.state.is_terminal:
                await self._adopt_manifest(profile)
            if not profile.state.is_terminal:
                logger.info("rayprof controller: resuming %s in state %s", profile.id, profile.state.value)
                self._start_profile(profile)

    async def _adopt_manifest(self, profile: _Profile) -> None:
        """Finish a restored profile whose manifest, the commit point, was written before the restart."""
        storage = open_storage(profile.storage)
        try:
            if not await asyncio.to_thread(storage.exists, manifest_key(profile.target, profile.id)):
                return
            manifest = await asyncio.to_thread(read_manifest, storage, profile.target, profile.id)
        except RayprofError as e:
            logger.warning("rayprof controller: cannot read the manifest of %s: %s", profile.id, e)
            return
        profile.ranks = {r.rank: r for r in manifest.ranks}
        profile.manifest_uri = storage.uri(manifest_key(profile.target, profile.id))
        profile.reason = manifest.reason
        profile.finished_at = manifest.finished_at
        await self._transition(profile, manifest.status)

    async def ping(self) -> str:
        """Liveness check; also starts background work."""
        await self._ensure_started()
        return "ok"

    async def configure(self, storage: StorageSpec) -> None:
        """Change where new profiles are stored (server configuration, never per request)."""
        await self._ensure_started()
        self._config = self._config.model_copy(update={"storage": storage})
        data = storage.model_dump_json().encode()
        await asyncio.to_thread(open_storage(self._home).put_bytes, data, CONFIG_KEY, "manifest")

    async def config(self) -> ControllerConfig:
        """Settings in force."""
        return self._config

    # ---- agent protocol --------------------------------------------------

    async def register(self, info: WorkerInfo) -> None:
        """An agent announces itself; a new agent on the same rank replaces the old one."""
        await self._ensure_started()
        for agent_id, worker in list(self._workers.items()):
            same_rank = worker.info.target == info.target and worker.info.world_rank == info.world_rank
            if same_rank and agent_id != info.agent_id:
                self._drop_worker(agent_id, "the worker was replaced (worker group restarted)")
        if info.agent_id not in self._workers:
            self._workers[info.agent_id] = _Worker(info)
        for profile in self._profiles.values():
            rank = info.world_rank
            if profile.target == info.target and not profile.state.is_terminal and rank in profile.ranks:
                profile.agents.setdefault(rank, info.agent_id)
        logger.info("rayprof controller: registered %s rank %d (%s)", info.target, info.world_rank, info.host)

    async def poll(self, heartbeat: Heartbeat) -> Command | None:
        """Long-poll: record progress, then wait for a command up to the poll timeout."""
        await self._ensure_started()
        worker = self._workers.get(heartbeat.agent_id)
        if worker is None:
            return Command(kind="register")
        worker.step = heartbeat.step
        worker.step_time_s = heartbeat.step_time_s
        worker.seen_at = time.monotonic()
        if not worker.commands:
            worker.wake.clear()
            try:
                await asyncio.wait_for(worker.wake.wait(), self._config.poll_timeout_s)
            except TimeoutError:
                pass
        if worker.commands and self._workers.get(heartbeat.agent_id) is worker:
            return worker.commands.popleft()
        return None

    async def report(self, event: RankEvent) -> None:
        """An agent's window changed state."""
        await self._ensure_started()
        profile = self._profiles.get(event.profile_id)
        worker = self._workers.get(event.agent_id)
        if profile is None or profile.state.is_terminal or worker is None:
            return
        rank = worker.info.world_rank
        current = profile.ranks.get(rank)
        if worker.info.target != profile.target or current is None or current.state.is_terminal:
            return
        now = utcnow()
        update: dict[str, Any] = {"state": event.state, "reason": event.reason}
        if event.state == RankState.ARMED:
            update["armed_at"] = now
        elif event.state == RankState.CAPTURING:
            update["capture_started_at"] = now
            if profile.capture_started_at is None:
                profile.capture_started_at = now
        elif event.state == RankState.UPLOADING:
            update["capture_ended_at"] = now
        if event.state.is_terminal:
            update.update(
                finished_at=now,
                first_step=event.first_step,
                last_step=event.last_step,
                step_durations_ms=event.step_durations_ms,
                base_time_ns=event.base_time_ns,
                trace_bytes=event.trace_bytes,
                artifacts=event.artifacts,
            )
        profile.ranks[rank] = current.model_copy(update=update)
        if event.state in (RankState.FAILED, RankState.CANCELLED):
            logger.info("rayprof controller: %s rank %d %s: %s", profile.id, rank, event.state.value, event.reason)
        profile.changed.set()
        if event.state.is_terminal:
            # The agent drops a result once this call returns: save it first, or a
            # controller restart before the manifest is written would lose it.
            await self._persist(profile)

    # ---- client API ------------------------------------------------------

    async def submit(self, request: ProfileRequest) -> ProfileStatus:
        """Validate and accept a profile request; it runs in the background."""
        await self._ensure_started()
        await self._await_target(request.target)
        self._validate(request)
        target = request.target
        # A profile that has ended but not yet released its slot is not in the way.
        queued = [p for p in self._waiting.get(target, []) if not self._profiles[p].state.is_terminal]
        running = self._active.get(target)
        if running is not None and self._profiles[running].state.is_terminal:
            running = None
        if running is not None or queued:
            if not request.queue:
                raise ConflictError(
                    f"profile {running or queued[0]} is already running on {target!r}; "
                    "retry when it ends or pass queue=true",
                    target=target,
                )
            if len(queued) >= self._config.max_queued_per_target:
                raise ConflictError(
                    f"{len(queued)} profiles already queued on {target!r} "
                    f"(max {self._config.max_queued_per_target})",
                    target=target,
                )
        profile = _Profile(id=_new_profile_id(), request=request, storage=self._config.storage)
        self._profiles[profile.id] = profile
        await self._persist(profile)
        self._start_profile(profile)
        return profile.snapshot()

    async def get(self, profile_id: str) -> ProfileStatus:
        """Current status of one profile."""
        await self._ensure_started()
        return self._profile(profile_id).snapshot()

    async def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        """Status once the profile changes state or ends, or after ``timeout_s``."""
        await self._ensure_started()
        profile = self._profile(profile_id)
        if not profile.state.is_terminal:
            profile.changed.clear()
            try:
                await asyncio.wait_for(profile.changed.wait(), max(0.0, min(timeout_s, 60.0)))
            except TimeoutError:
                pass
        return profile.snapshot()

    async def list(self, target: str | None = None, state: ProfileState | None = None) -> list[ProfileStatus]:
        """Profiles, newest first, optionally filtered."""
        await self._ensure_started()
        found = [
            p.snapshot()
            for p in self._profiles.values()
            if (target is None or p.target == target) and (state is None or p.state == state)
        ]
        return sorted(found, key=lambda s: s.created_at, reverse=True)

    async def cancel(self, profile_id: str) -> ProfileStatus:
        """Stop a profile: armed and capturing ranks drop their window."""
        await self._ensure_started()
        profile = self._profile(profile_id)
        if profile.state.is_terminal:
            return profile.snapshot()
        profile.cancel_requested = True
        for rank, result in profile.ranks.items():
            if result.state == RankState.WAITING:
                # Not armed yet: nothing to undo on the worker.
                profile.ranks[rank] = result.model_copy(
                    update={"state": RankState.CANCELLED, "reason": "cancelled before the window was armed"}
                )
            elif not result.state.is_terminal:
                worker = self._workers.get(profile.agents.get(rank, ""))
                if worker is not None:
                    worker.send(Command(kind="cancel", profile_id=profile.id))
        profile.changed.set()
        return profile.snapshot()

    async def manifest(self, profile_id: str) -> Manifest:
        """The stored manifest of a finished profile."""
        await self._ensure_started()
        profile = self._profile(profile_id)
        if profile.manifest_uri is None:
            raise ProfileNotFoundError(
                f"profile {profile_id} has no manifest yet (state {profile.state.value})", profile_id=profile_id
            )
        storage = open_storage(profile.storage)
        return await asyncio.to_thread(read_manifest, storage, profile.target, profile.id)

    async def targets(self) -> list[TargetInfo]:
        """Live Ray Train runs with registered agents."""
        await self._ensure_started()
        now = time.monotonic()
        by_target: dict[str, list[_Worker]] = {}
        for worker in self._workers.values():
            by_target.setdefault(worker.info.target, []).append(worker)
        return [
            TargetInfo(
                name=name,
                world_size=max(w.info.world_size for w in workers),
                ranks=[
                    WorkerStatus(info=w.info, step=w.step, step_time_s=w.step_time_s, last_seen_s=now - w.seen_at)
                    for w in sorted(workers, key=lambda w: w.info.world_rank)
                ],
                active_profile=self._active.get(name),
                queued_profiles=list(self._waiting.get(name, [])),
            )
            for name, workers in sorted(by_target.items())
        ]

    # ---- internals -------------------------------------------------------

    def _profile(self, profile_id: str) -> _Profile:
        try:
            return self._profiles[profile_id]
        except KeyError:
            raise ProfileNotFoundError(f"no profile with id {profile_id!r}", profile_id=profile_id) from None

    def _target_workers(self, target: str) -> dict[int, _Worker]:
        return {w.info.world_rank: w for w in self._workers.values() if w.info.target == target}

    async def _await_target(self, target: str) -> None:
        """Give an unknown target until one poll timeout after this actor started:
        after a restart, agents re-register within that and would otherwise get a 404."""
        until = self._started_at + self._config.poll_timeout_s
        while not self._target_workers(target) and time.monotonic() < until:
            await asyncio.sleep(0.05)

    def _validate(self, request: ProfileRequest) -> None:
        cfg = self._config
        if request.steps > cfg.max_steps:
            raise InvalidRequestError(f"steps={request.steps} is over the maximum of {cfg.max_steps} (RAYPROF_MAX_STEPS)")
        if request.warmup > cfg.max_warmup_steps:
            raise InvalidRequestError(
                f"warmup={request.warmup} is over the maximum of {cfg.max_warmup_steps} (RAYPROF_MAX_WARMUP_STEPS)"
            )
        if request.timeout_s is not None and request.timeout_s > cfg.max_request_timeout_s:
            raise InvalidRequestError(
                f"timeout_s={request.timeout_s} is over the maximum of {cfg.max_request_timeout_s}"
            )
        workers = self._target_workers(request.target)
        if not workers:
            known = sorted({w.info.target for w in self._workers.values()})
            raise TargetNotFoundError(
                f"no live training run named {request.target!r}; known targets: {known or 'none'}",
                target=request.target,
            )
        world_size = max(w.info.world_size for w in workers.values())
        if request.ranks is not None:
            bad = sorted(r for r in set(request.ranks) if r >= world_size)
            if bad:
                raise InvalidRequestError(
                    f"ranks {bad} do not exist in {request.target!r} (world size {world_size})", target=request.target
                )
            if len(set(request.ranks)) != len(request.ranks):
                raise InvalidRequestError("ranks lists a rank twice", target=request.target)

    def _start_profile(self, profile: _Profile) -> None:
        # Queue synchronously so a second submit sees this one at once.
        self._waiting.setdefault(profile.target, []).append(profile.id)
        self._spawn(self._run_profile(profile))

    async def _run_profile(self, profile: _Profile) -> None:
        target = profile.target
        slot = self._slots.setdefault(target, asyncio.Lock())
        waiting = self._waiting[target]
        try:
            async with slot:
                waiting.remove(profile.id)
                self._active[target] = profile.id
                try:
                    if profile.cancel_requested:
                        await self._finish(profile, ProfileState.CANCELLED, "cancelled before it was scheduled")
                        return
                    if profile.start_step is None:
                        await self._schedule(profile)
                    if not profile.state.is_terminal:
                        await self._await_ranks(profile)
                        await self._finalize(profile)
                finally:
                    self._active.pop(target, None)
        except Exception as e:
            logger.exception("rayprof controller: profile %s failed", profile.id)
            if not profile.state.is_terminal:
                await self._finish(profile, ProfileState.FAILED, f"controller error: {type(e).__name__}: {e}")
        finally:
            if profile.id in waiting:
                waiting.remove(profile.id)

    async def _schedule(self, profile: _Profile) -> None:
        """Pick the start step S ahead of the fastest rank and arm every selected rank."""
        request = profile.request
        workers = self._target_workers(profile.target)
        if not workers:
            await self._finish(profile, ProfileState.FAILED, f"target {profile.target!r} has no live workers")
            return
        world_size = max(w.info.world_size for w in workers.values())
        selected = sorted(request.ranks) if request.ranks is not None else list(range(world_size))
        # Right after a controller or worker-group restart some agents have not
        # re-registered yet; they do within a poll timeout, so give them that long.
        wait_until = time.monotonic() + self._config.poll_timeout_s
        while any(r not in workers for r in selected) and time.monotonic() < wait_until:
            await asyncio.sleep(0.05)
            workers = self._target_workers(profile.target)
        for rank in selected:
            worker = workers.get(rank)
            if worker is None:
                profile.ranks[rank] = RankResult(
                    rank=rank,
                    state=RankState.FAILED,
                    reason=f"no agent registered for this rank within {self._config.poll_timeout_s:g}s",
                )
            else:
                profile.ranks[rank] = _rank_result(worker.info)
                profile.agents[rank] = worker.info.agent_id
        present = [workers[r] for r in selected if r in workers]
        if not present:
            return

        # Ask for fresh step counts so S is chosen from where ranks are now.
        sync_sent = time.monotonic()
        for worker in present:
            worker.send(Command(kind="sync"))
        sync_deadline = sync_sent + self._config.sync_timeout_s
        while any(w.seen_at < sync_sent for w in present) and time.monotonic() < sync_deadline:
            await asyncio.sleep(0.005)

        if profile.cancel_requested:
            return
        now = time.monotonic()
        ahead = max(w.estimated_step(now) for w in present)
        step_times = [w.step_time_s for w in present if w.step_time_s]
        # Arming grows with the number of ranks like the sync round does, and was
        # measured at ~4x it (1,024 ranks: sync 0.96 s, all armed 3.8 s).
        lead_s = self._config.arm_lead_s + _ARM_COST_PER_SYNC * (now - sync_sent)
        lead = MIN_LEAD_STEPS
        if step_times:
            lead = max(lead, math.ceil(lead_s / min(step_times)))
        profile.start_step = math.floor(ahead) + lead + request.warmup
        profile.steps = self._steps_under_cap(profile)
        profile.scheduled_at = utcnow()
        timeout = request.timeout_s or self._config.request_timeout_s
        profile.deadline = time.monotonic() + timeout
        window = WindowSpec(
            profile_id=profile.id,
            target=profile.target,
            start_step=profile.start_step,
            steps=profile.steps,
            warmup=request.warmup,
            activities=request.activities,
            record_shapes=request.record_shapes,
            profile_memory=request.profile_memory,
            with_stack=request.with_stack,
            with_flops=request.with_flops,
            with_modules=request.with_modules,
            storage=profile.storage,
            prefix=profile.prefix,
            max_trace_bytes=self._config.max_trace_bytes,
        )
        for worker in present:
            worker.send(Command(kind="arm", window=window))
        await self._transition(profile, ProfileState.SCHEDULED)

    async def _await_ranks(self, profile: _Profile) -> None:
        """Wait until every rank is terminal, failing the ones that time out or vanish."""
        if profile.deadline is None:
            timeout = profile.request.timeout_s or self._config.request_timeout_s
            profile.deadline = time.monotonic() + timeout
        while True:
            self._fail_lost_ranks(profile)
            ranks = profile.ranks.values()
            if all(r.state.is_terminal for r in ranks):
                return
            if profile.state == ProfileState.SCHEDULED and profile.capture_started_at is not None:
                await self._transition(profile, ProfileState.CAPTURING)
            capture_over = all(r.state in (RankState.UPLOADING,) or r.state.is_terminal for r in ranks)
            if profile.state in (ProfileState.SCHEDULED, ProfileState.CAPTURING) and capture_over:
                await self._transition(profile, ProfileState.COLLECTING)
            left = profile.deadline - time.monotonic()
            if left <= 0:
                for rank, result in profile.ranks.items():
                    if not result.state.is_terminal:
                        profile.ranks[rank] = result.model_copy(
                            update={
                                "state": RankState.FAILED,
                                "reason": f"no result within the {profile.request.timeout_s or self._config.request_timeout_s:g}s "
                                f"timeout (last state {result.state.value})",
                                "finished_at": utcnow(),
                            }
                        )
                return
            profile.changed.clear()
            try:
                await asyncio.wait_for(profile.changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass

    def _fail_lost_ranks(self, profile: _Profile) -> None:
        for rank, result in profile.ranks.items():
            if result.state.is_terminal:
                continue
            agent_id = profile.agents.get(rank)
            if profile.cancel_requested and (agent_id is None or agent_id not in self._workers):
                profile.ranks[rank] = result.model_copy(
                    update={"state": RankState.CANCELLED, "reason": "cancelled", "finished_at": utcnow()}
                )
            elif agent_id is not None and agent_id not in self._workers:
                profile.ranks[rank] = result.model_copy(
                    update={
                        "state": RankState.FAILED,
                        "reason": "worker stopped responding during the window (process exited or was restarted)",
                        "finished_at": utcnow(),
                    }
                )

    async def _finalize(self, profile: _Profile) -> None:
        ranks = list(profile.ranks.values())
        done = [r for r in ranks if r.state == RankState.DONE]
        cut = sorted(r.rank for r in done if r.last_step is not None and r.last_step + 1 < (profile.stop_step or 0))
        shortened = profile.steps is not None and profile.steps < profile.request.steps
        if profile.cancel_requested:
            state, reason = ProfileState.CANCELLED, "cancelled by request"
        elif len(done) == len(ranks) and not cut and not shortened:
            state, reason = ProfileState.DONE, None
        elif done:
            failed = sorted(r.rank for r in ranks if r.state != RankState.DONE)
            notes = [f"ranks {failed} did not complete"] if failed else []
            notes += [f"ranks {cut} cut their trace at the byte cap (see their reasons)"] if cut else []
            # The shortening note set when the window was planned.
            notes += [profile.reason] if shortened and profile.reason else []
            state, reason = ProfileState.PARTIAL, "; ".join(notes)
        else:
            state, reason = ProfileState.FAILED, _common_reason(ranks)
        await self._finish(profile, state, reason)

    def _steps_under_cap(self, profile: _Profile) -> int:
        """The window's length: as asked, or shorter when the last like window showed it would pass the byte cap.

        Stopping early is cheaper than cutting at export: the profiler holds
        every event in memory until the window ends.
        """
        request = profile.request
        per_step = self._trace_bytes_per_step(request)
        cap = self._config.max_trace_bytes
        if per_step is None or per_step * request.steps <= cap:
            return request.steps
        steps = max(1, min(request.steps, math.floor(_CAP_MARGIN * cap / per_step)))
        profile.reason = (
            f"window shortened from {request.steps} to {steps} steps: the last window on {request.target!r} with "
            f"these options wrote up to {per_step:,.0f} trace bytes per step on one rank, and the cap is "
            f"{cap:,} bytes (RAYPROF_MAX_TRACE_BYTES)"
        )
        return steps

    def _trace_bytes_per_step(self, request: ProfileRequest) -> float | None:
        """Largest raw trace bytes per step on any rank, in the latest finished window like ``request``."""
        options = _size_options(request)
        like = [
            p
            for p in self._profiles.values()
            if p.target == request.target
            and p.state.is_terminal
            and p.steps
            and p.finished_at is not None
            and _size_options(p.request) == options
            and any(r.trace_bytes for r in p.ranks.values())
        ]
        if not like:
            return None
        latest = max(like, key=lambda p: p.finished_at)
        return max(r.trace_bytes / latest.steps for r in latest.ranks.values() if r.trace_bytes)

    async def _finish(self, profile: _Profile, state: ProfileState, reason: str | None) -> None:
        """Write the manifest (the commit point), then record the terminal state."""
        profile.finished_at = utcnow()
        manifest = Manifest(
            profile_id=profile.id,
            target=profile.target,
            status=state,
            reason=reason,
            request=profile.request,
            storage_uri=f"{normalize_uri(profile.storage.uri)}/{profile.prefix}",
            start_step=profile.start_step,
            stop_step=profile.stop_step,
            cluster=self._cluster_info(profile),
            ranks=[profile.ranks[r] for r in sorted(profile.ranks)],
            requested_at=profile.created_at,
            scheduled_at=profile.scheduled_at,
            capture_started_at=profile.capture_started_at,
            finished_at=profile.finished_at,
        )
        if any(a.kind == "trace" for a in manifest.all_artifacts()) and state != ProfileState.CANCELLED:
            manifest = await self._postprocess(profile, manifest)
        storage = open_storage(profile.storage)
        try:
            profile.manifest_uri = await asyncio.to_thread(write_manifest, storage, manifest)
        except RayprofError as e:
            state, reason = ProfileState.FAILED, f"could not write the manifest: {e}"
        profile.reason = reason
        await self._transition(profile, state)

    async def _postprocess(self, profile: _Profile, manifest: Manifest) -> Manifest:
        """Add the merged trace, report and summary; a failed analysis never fails the profile."""
        try:
            ref = _postprocess_task.remote(profile.storage, profile.prefix, manifest)
            result: PostprocessResult = await asyncio.wait_for(ref, self._config.request_timeout_s)
        except Exception as e:
            logger.warning("rayprof controller: analysis of %s failed: %s", profile.id, e)
            return manifest.model_copy(update={"analysis_error": f"{type(e).__name__}: {str(e)[:500]}"})
        return manifest.model_copy(update={"artifacts": result.artifacts, "summary": result.summary})

    def _cluster_info(self, profile: _Profile) -> dict[str, Any]:
        infos = [w.info for w in self._workers.values() if w.info.target == profile.target]
        return {
            "ray_version": ray.__version__,
            "torch_version": infos[0].torch_version if infos else None,
            "ray_job_ids": sorted({i.ray_job_id for i in infos if i.ray_job_id}),
            "submission_ids": sorted({i.submission_id for i in infos if i.submission_id}),
            "experiment_paths": sorted({i.experiment_path for i in infos if i.experiment_path}),
            "nodes": len({i.node_id for i in infos}),
            "world_size": max((i.world_size for i in infos), default=None),
        }

    async def _transition(self, profile: _Profile, state: ProfileState) -> None:
        previous, profile.state = profile.state, state
        logger.info("rayprof controller: %s %s -> %s", profile.id, previous.value, state.value)
        profile.changed.set()
        await self._persist(profile)

    async def _persist(self, profile: _Profile) -> None:
        """Save ``profile`` as it is now. Callers that arrive during a write share
        the next one, so a thousand ranks finishing at once cost a few writes."""
        assert self._persist_lock is not None
        profile.saves_asked += 1
        wanted = profile.saves_asked
        async with self._persist_lock:
            if profile.saves_done >= wanted:
                return
            covered = profile.saves_asked
            data = _SavedProfile(status=profile.snapshot(), storage=profile.storage).model_dump_json().encode()
            storage = open_storage(self._home)
            try:
                await asyncio.to_thread(storage.put_bytes, data, state_key(profile.id), "manifest")
            except RayprofError as e:
                logger.warning("rayprof controller: cannot persist %s: %s", profile.id, e)
            profile.saves_done = covered

    def _drop_worker(self, agent_id: str, reason: str) -> None:
        worker = self._workers.pop(agent_id, None)
        if worker is None:
            return
        worker.wake.set()
        logger.info("rayprof controller: dropped %s rank %d: %s", worker.info.target, worker.info.world_rank, reason)
        for profile in self._profiles.values():
            if not profile.state.is_terminal and agent_id in profile.agents.values():
                profile.changed.set()

    async def _reap_workers(self) -> None:
        expiry = self._config.poll_timeout_s + self._config.worker_expiry_grace_s
        while True:
            await asyncio.sleep(min(1.0, expiry / 4))
            now = time.monotonic()
            for agent_id, worker in list(self._workers.items()):
                if now - worker.seen_at > expiry:
                    self._drop_worker(agent_id, f"no heartbeat for {now - worker.seen_at:.0f}s")


@ray.remote(num_cpus=0, max_retries=0)
def _postprocess_task(spec: StorageSpec, prefix: str, draft: Manifest) -> PostprocessResult:
    return postprocess(spec, prefix, draft)


def _rank_result(info: WorkerInfo) -> RankResult:
    return RankResult(
        rank=info.world_rank,
        local_rank=info.local_rank,
        node_id=info.node_id,
        host=info.host,
        pid=info.pid,
        device=info.device,
        state=RankState.WAITING,
    )


def _size_options(request: ProfileRequest) -> tuple[Any, ...]:
    """The request fields that decide how many trace bytes a step writes."""
    return (
        tuple(request.activities or ()),
        request.record_shapes,
        request.profile_memory,
        request.with_stack,
        request.with_flops,
        request.with_modules,
    )


def _common_reason(ranks: list[RankResult]) -> str:
    reasons = sorted({r.reason or r.state.value for r in ranks})
    return "; ".join(reasons)[:500] if reasons else "no ranks selected"


def _new_profile_id() -> str:
    return f"prof-{utcnow().strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def create_controller(config: ControllerConfig | None = None) -> Any:
    """Handle to the control actor, created (detached, restartable) if it does not exist yet."""
    actor_cls = ray.remote(Controller)
    return actor_cls.options(
        name=CONTROLLER_NAME,
        namespace=CONTROLLER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
        max_concurrency=10_000,
    ).remote(config or controller_config())
