"""The control actor: its RPC surface for agents and clients.

A named, detached, async Ray actor (``rayprof-controller`` in namespace
``rayprof``). Agents long-poll it; clients submit, watch, cancel and delete
profiles. The worker registry, the state machine, the decisions and the
saving live in their own modules, as do the calls agents make
(:mod:`actors.controller.agents.agent_side`) and the calls clients make about one
profile (:mod:`actors.controller.profiles.client_side`); this one wires them to Ray.
The client calls are the operations of :class:`orchestrator.models.api.ProfilingApi`, which
this class implements (tests/unit/test_service_calls.py compares the signatures); callers send
them through the Ray transport :class:`actors.controller.rpc.ControllerRpc`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import ray

from actors.controller.agents.agent_side import ActorDeaths, AgentSide, deaths_in_ray
from actors.controller.agents.ended_runs import EndedRuns
from actors.controller.agents.registry import Registry
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.cluster import cluster_info, ray_cluster_id
from actors.controller.diagnosis.stacks_bundle import StacksTaker
from actors.controller.diagnosis.watches import Watches
from actors.controller.live_config import LiveConfig
from actors.controller.monitoring.recorder import Recorder, default_recorder
from actors.controller.monitoring.telemetry import Telemetry
from actors.controller.profiles.client_side import ClientSide
from actors.controller.profiles.commit import Commit
from actors.controller.profiles.idempotency import SubmitKey
from actors.controller.profiles.intake import Intake
from actors.controller.profiles.runner import Runner
from actors.controller.profiles.state import Profile
from actors.controller.profiles.target_queue import TargetQueue
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.cleanup import Cleanup
from actors.controller.saved.leases import Leases
from actors.controller.saved.name_lease import NameLease
from actors.controller.saved.persistence import Persistence
from actors.controller.saved.retention import Retention
from actors.controller.startup import Startup
from orchestrator.build import build_id
from orchestrator.config import controller_config
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig, TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import ProfileStatus, Trigger
from orchestrator.models.requests import ProfileRequest
from orchestrator.models.summaries import GcReport, GcRequest
from orchestrator.settings import (
    CONTROLLER_NAME,
    CONTROLLER_NAMESPACE,
    DEFAULT_HISTORY_MAX_POINTS,
    DEFAULT_HISTORY_SPAN_S,
)

__all__ = ["Controller", "create_controller"]

logger = logging.getLogger(__name__)

class Controller(Startup, AgentSide, ClientSide):
    """Registry of targets and the state machine of every profile request.

    ``postprocess``, ``cluster``, ``recorder`` and ``actor_deaths`` are seams for tests that run the
    class without Ray; the actor uses a Ray task, the Ray cluster id (which also
    names the holder of the cluster name's lease), what this Ray release needs to set its gauges and Ray's
    GCS (why a silent worker's actor ended). ``clock`` is a seam too: a test
    steps one (:mod:`actors.controller.clock`) instead of sleeping.
    """

    def __init__(
        self,
        config: ControllerConfig,
        postprocess: Any = None,
        cluster: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        recorder: Callable[[], Recorder] | None = None,
        actor_deaths: ActorDeaths = deaths_in_ray,
    ) -> None:
        # The code this process loaded, read before anything can upgrade the files under it.
        self._build = build_id()
        # Ray leaves an actor's root logger at WARNING; state changes are worth keeping.
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # State lives where the constructor's config points: a restarted actor
        # is constructed with the same config and finds it again.
        self._home = config.storage
        owner = cluster or ray_cluster_id()
        self._cluster = config.cluster_name or owner
        self._lease = NameLease(self._home, self._cluster, owner, clock.monotonic)
        # The one holder of the settings in force, which every part reads (configure changes the storage).
        self._settings = LiveConfig(config.model_copy(update={"cluster_name": self._cluster}))
        self._clock = clock
        self._actor_deaths = actor_deaths
        self._registry = Registry(clock.monotonic)
        self._persistence = Persistence(self._home, self._cluster)
        self._catalog = Catalog(self._persistence)
        # The unfinished profiles, by id: what agents report on.
        self._profiles = self._catalog.live
        self._queue = TargetQueue(self._profiles, self._settings)
        self._tasks: set[asyncio.Task] = set()
        self._ready: asyncio.Event | None = None
        if postprocess is None:
            from actors.controller.profiles.postprocess_job import postprocess_in_task

            postprocess = postprocess_in_task
        self._telemetry = Telemetry(
            self._registry,
            self._home,
            self._cluster,
            self._settings,
            # Late-bound: the watches, built below, act through the intake and stacks built after this.
            lambda workers, now: self._watches.assess(workers, now),
            self._save_checked,
            self._catalog.__contains__,
            self._spawn,
            clock,
            recorder or default_recorder(),
        )
        postprocess = self._telemetry.timed(postprocess)
        self._leases = Leases(self._cluster, self._home, self._settings, self._profiles, clock)
        self._commit = Commit(self._persistence, self._leases)
        self._runner = Runner(
            self._registry, self._commit, self._settings, self._catalog.known, postprocess, partial(cluster_info, self._registry), clock
        )
        self._retention = Retention(self._persistence, self._settings, clock)
        self._cleanup = Cleanup(self._catalog, self._retention, self._settings, clock)
        self._stacks = StacksTaker(self._registry, self._commit, self._settings, self._catalog, self._leases, clock)
        self._intake = Intake(
            self._settings, self._registry, self._catalog, self._queue, self._persistence, self._leases,
            self._runner, self._telemetry, self._retention, self._spawn, clock,
        )
        self._watches = Watches(
            self._registry, self._persistence, self._settings, self._take_stacks, self._intake.submit, self._spawn, clock
        )
        self._ended = EndedRuns()

    # ---- lifecycle (start and restore: actors.controller.startup) ---------

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start_background(self) -> None:
        self._spawn(self._reap_workers())
        self._spawn(self._monitor())
        self._spawn(self._leases.renew_forever())

    async def ping(self) -> str:
        """Liveness check, answered with this controller's build id (:func:`orchestrator.build.build_id`); also
        starts background work. A controller refused its cluster name says so."""
        await self._ensure_started()
        if self._refusal is not None:
            raise self._refusal
        return self._build

    async def configure(self, storage: StorageSpec) -> None:
        """Change where new profiles are stored (server configuration, never per request)."""
        await self._restored_state()
        await self._persistence.save_config(storage)
        self._settings.use_storage(storage)

    async def config(self) -> ControllerConfig:
        """Settings in force, the configured storage included (restored first)."""
        await self._restored_state()
        return self._settings()

    # ---- client API ------------------------------------------------------

    async def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus:
        """Validate and accept a profile request; it runs in the background. A submit with the
        ``idempotency_key`` of an earlier one (a client's retry) gets the earlier one's profile."""
        await self._restored_state()
        return await self._intake.submit(request, key=SubmitKey.of(idempotency_key, request) if idempotency_key else None)

    async def gc(self, request: GcRequest) -> GcReport:
        """Apply retention now and delete leftover folders; with ``dry_run``, only say what would go."""
        await self._restored_state()
        return await self._cleanup.collect(request)

    async def targets(self) -> list[TargetInfo]:
        """Live Ray Train runs with registered agents."""
        await self._ensure_started()
        now = self._clock.monotonic()
        return self._registry.target_infos(
            self._queue.active, self._queue.waiting, lambda workers: self._watches.assess(workers, now), self._watches.stall_stacks
        )

    async def stacks(self, target: str, native: bool = False, run: str | None = None) -> StacksBundle:
        """Every live rank's stacks, grouped and stored as a bundle of kind ``stacks``."""
        await self._restored_state()
        await self._intake.await_target(target)
        return await self._take_stacks(target, run, native)

    async def _take_stacks(
        self, target: str, run: str | None, native: bool, trigger: Trigger | None = None, memory: bool = False
    ) -> StacksBundle:
        bundle = await self._stacks.take(target, run, native, trigger, memory)
        if bundle.id in self._profiles:
            profile = self._profiles[bundle.id]
            await self._catalog.finish(profile)
            self._telemetry.bundle_ended(profile)
        await self._retention.enforce(self._catalog)
        return bundle

    async def create_watch(self, spec: WatchSpec) -> WatchStatus:
        """Start watching a target; saved, so it survives a controller restart."""
        await self._restored_state()
        return await self._watches.create(spec)

    async def get_watch(self, watch_id: str) -> WatchStatus:
        await self._restored_state()
        return self._watches.get(watch_id)

    async def list_watches(self) -> list[WatchStatus]:
        await self._restored_state()
        return self._watches.list()

    async def delete_watch(self, watch_id: str) -> WatchStatus:
        """Stop and forget a watch; returns it as it was."""
        await self._restored_state()
        return await self._watches.delete(watch_id)

    async def history(
        self,
        target: str,
        run: str | None = None,
        span_s: float = DEFAULT_HISTORY_SPAN_S,
        ranks: list[int] | None = None,
        max_points: int = DEFAULT_HISTORY_MAX_POINTS,
    ) -> TargetHistory:
        """Step-time history of a run of ``target`` over the last ``span_s`` seconds (of ``ranks``, or all),
        downsampled past ``max_points`` points (the slowest ranks, and a band of every rank)."""
        await self._ensure_started()
        return await self._telemetry.view(target, run, span_s, ranks, max_points)

    async def _monitor(self) -> None:
        """Health, watches and telemetry, from the heartbeats held here; a failed tick is logged, never fatal."""
        while True:
            await asyncio.sleep(self._settings().monitor_interval_s)
            self._monitor_step(self._clock.monotonic())

    def _monitor_step(self, now: float) -> None:
        """One pass of :meth:`_monitor` at ``now`` (the clock's monotonic time); a test steps it."""
        try:
            self._watches.tick(now)
        except Exception:
            logger.exception("rayprof controller: monitor tick failed")
        try:
            self._telemetry.tick(now, list(self._profiles.values()), self._watches.list())
        except Exception:
            logger.exception("rayprof controller: telemetry tick failed")
        if self._retention.retry_due(now):
            self._spawn(self._retention.enforce(self._catalog))
        self._forget_ended(now)

    def _forget_ended(self, now: float) -> None:
        """Drop what is kept per target and run once it has been gone for ``ended_run_kept_s``:
        a detached controller sees thousands of uniquely named runs come and go."""
        kept_s = self._settings().ended_run_kept_s
        gone = self._ended.check({(w.info.target, w.run) for w in self._registry.workers.values()}, now, kept_s)
        self._watches.forget(gone)
        self._runner.forget(gone.targets)
        self._registry.forget_left(now - kept_s)

    # ---- internals -------------------------------------------------------

    async def _save_checked(self, profile: Profile) -> None:
        """Save a profile whose post-window check ended, and its entry in the index of finished ones."""
        await self._persistence.save(profile)
        await self._catalog.refresh(profile)


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
