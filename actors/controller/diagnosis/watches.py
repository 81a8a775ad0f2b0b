"""Detection that acts: watches, and the stall detector's stacks taken once per stall.

Once per ``monitor_interval_s`` the controller reads the heartbeats it
already holds (no call to any rank, no work on training ranks): each run's
health (:mod:`actors.controller.diagnosis.health`) and, per target, the median step
time across ranks, kept as a rolling series. A watch's condition
(``slower_than`` x the rolling median, ``rank_lag`` steps, ``stalled``) that
holds for ``for_s`` runs its action, and so does a schedule (``every_s``) that is
due, on this tick and never on a rank's step: a profile window or every rank's stacks,
with the :class:`Trigger` recorded in the profile's status and manifest. A
cooldown and a cap over any rolling hour bound how often; a firing that fails
counts toward both, and a watch whose action fails
``RAYPROF_WATCH_MAX_FAILURES`` times in a row is paused with its reason. A
watch is checked against the server's limits when it is created, so it is
never refused on every firing. Watches are saved and come back after a
controller restart; a schedule's next firing is counted from its last saved
firing, so a restart fires only what is due.
"""

from __future__ import annotations

import logging
import statistics
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from actors.controller.agents.ended_runs import Gone
from actors.controller.agents.registry import Registry, Worker
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.diagnosis.health import Health, assess
from actors.controller.diagnosis.oom_watch import OomEvents
from actors.controller.diagnosis.watch_check import MIN_BASELINE_SAMPLES, check
from actors.controller.diagnosis.watch_record import FIRINGS_KEPT, WatchRecord
from actors.controller.saved.persistence import Persistence
from orchestrator.errors import ConflictError, InvalidRequestError, RayprofError, StorageError, WatchNotFoundError
from orchestrator.models.control import ControllerConfig
from orchestrator.models.diagnosis import WatchFiring, WatchSpec, WatchStatus, duration_text
from orchestrator.models.profile import Trigger
from orchestrator.models.requests import ProfileRequest, ProfileState

__all__ = ["Watches"]

logger = logging.getLogger(__name__)

_SERIES_KEPT = 3600
# Healthy ranks profiled beside the lagging ones (ranks="lagging").
_HEALTHY_BESIDE_LAGGING = 2
# A watch whose save failed (a firing, a pause) is saved again this often until it lands.
_SAVE_RETRY_S = 5.0

# (target, run, native frames, trigger, memory snapshots too)
TakeStacks = Callable[[str, str | None, bool, Trigger, bool], Awaitable[Any]]
Submit = Callable[[ProfileRequest, Trigger], Awaitable[Any]]

_NOT_LIVE = "target not live"
# An OOM watch on a run with no CUDA device can never fire (the allocator it watches is CUDA's): said, not silent.
_NO_CUDA = "no rank of this run has a CUDA device: an OOM watch fires only when one runs out of CUDA memory"


class Watches:
    """Every watch of one controller, the per-target step-time series, and stall episodes."""

    def __init__(
        self,
        registry: Registry,
        persistence: Persistence,
        config: Callable[[], ControllerConfig],
        take_stacks: TakeStacks,
        submit: Submit,
        spawn: Callable[[Any], Any],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._registry = registry
        self._persistence = persistence
        self._config = config
        self._take_stacks = take_stacks
        self._submit = submit
        self._spawn = spawn
        self._watches: dict[str, WatchRecord] = {}
        # Creates between their limit check and their save: counted against the limit, so
        # concurrent creates cannot all pass the check before any of them is added.
        self._creating = 0
        self._series: dict[str, deque[tuple[float, float]]] = {}
        self._stalled: set[tuple[str, str]] = set()
        # Per stalled run: the stacks bundle taken when it stalled, and its one-line verdict.
        self.stall_stacks: dict[tuple[str, str], tuple[str, str]] = {}
        self.oom = OomEvents(registry)
        # The registry's clock: firings, cooldowns, caps and schedules are counted on its wall time (they
        # are saved, so a restart counts on from them), holds on its monotonic time; tests step it.
        self.clock = clock

    # ---- the API ----------------------------------------------------------

    async def create(self, spec: WatchSpec) -> WatchStatus:
        config = self._config()
        check(spec, config)
        held = len(self._watches) + self._creating
        if held >= config.max_watches:
            raise InvalidRequestError(f"{held} watches already (max {config.max_watches}, RAYPROF_MAX_WATCHES)")
        watch = WatchRecord(id=f"watch-{uuid.uuid4().hex[:10]}", spec=spec, created_at=self.clock.wall())
        status = watch.status(self.clock.monotonic())
        self._creating += 1
        try:
            await self._persistence.save_watch(status)
        finally:
            self._creating -= 1
        self._watches[watch.id] = watch
        return status

    def get(self, watch_id: str) -> WatchStatus:
        return self._watch(watch_id).status(self.clock.monotonic())

    def list(self) -> list[WatchStatus]:
        now = self.clock.monotonic()
        return [w.status(now) for w in sorted(self._watches.values(), key=lambda w: w.created_at)]

    async def delete(self, watch_id: str) -> WatchStatus:
        status = self.get(watch_id)
        await self._persistence.delete_watch(watch_id)
        self._watches.pop(watch_id, None)
        return status

    def restore(self, saved: list[WatchStatus]) -> None:
        for s in saved:
            watch = WatchRecord(
                id=s.id,
                spec=s.spec,
                created_at=s.created_at,
                firings=list(s.firings),
                # Saved before fired_at existed: the firings kept are the best record of the last hour.
                fired=deque(s.fired_at or [f.at for f in s.firings]),
                failures=s.failures,
                paused=s.paused,
            )
            self._watches.setdefault(s.id, watch)

    def recover(self, triggered: list[tuple[str, Trigger]]) -> None:
        """After :meth:`restore`: firings whose action left a profile (``(profile id, trigger)``) but whose
        save never landed (the controller died in between) are counted again, so the restored watch
        keeps its schedule, cooldown and hourly cap instead of firing again at once."""
        for profile_id, trigger in sorted(triggered, key=lambda pt: pt[1].at):
            watch = self._watches.get(trigger.watch_id or "")
            if watch is None or (watch.fired and trigger.at <= watch.fired[-1]):
                continue
            watch.fired.append(trigger.at)
            watch.firings = [*watch.firings, WatchFiring(at=trigger.at, profile_id=profile_id, trigger=trigger)][
                -FIRINGS_KEPT:
            ]
            watch.changes += 1
            logger.info("rayprof controller: %s: recovered its firing of %s from before the restart", watch.id, profile_id)

    def _watch(self, watch_id: str) -> WatchRecord:
        try:
            return self._watches[watch_id]
        except KeyError:
            raise WatchNotFoundError(f"no watch with id {watch_id!r}") from None

    def forget(self, gone: Gone) -> None:
        """Drop the step-time series of targets and the stall stacks of runs gone for good."""
        for target in gone.targets:
            self._series.pop(target, None)
        for key in gone.runs:
            self.stall_stacks.pop(key, None)
        self.oom.forget(gone.targets)

    # ---- one monitor tick ---------------------------------------------------

    def tick(self, now: float) -> None:
        """One monitor tick at ``now`` (the clock's monotonic time): assess every run, take stacks on a
        new stall, advance every watch once; actions run as tasks. The controller's monitor loop calls it
        on its clock; a test calls it after stepping its own."""
        config = self._config()
        healths: dict[tuple[str, str], tuple[dict[int, Worker], Health]] = {}
        stalled_now: set[tuple[str, str]] = set()
        for name in self._registry.names():
            for run, workers in self._registry.runs(name).items():
                health = self.assess(workers, now)
                healths[(name, run)] = (workers, health)
                if health.stalled:
                    stalled_now.add((name, run))
        for key in sorted(stalled_now - self._stalled):
            health = healths[key][1]
            logger.info("rayprof controller: %s run %s STALLED (%.0fs without progress)", key[0], key[1], health.stalled_s)
            if config.stall_auto_stacks:
                trigger = Trigger(
                    kind="stalled",
                    observed=health.stalled_s,
                    threshold=health.threshold_s,
                    at=self.clock.wall(),
                    detail=f"no rank advanced for {health.stalled_s:.0f}s (threshold {health.threshold_s:.0f}s)",
                )
                self._spawn(self._stall_stacks(key, trigger))
        self._stalled = stalled_now
        newest: dict[str, tuple[dict[int, Worker], Health]] = {}
        for (name, _run), value in healths.items():
            newest.setdefault(name, value)  # runs() lists the newest run first
        for name, (_workers, health) in newest.items():
            if health.median_step_s is not None:
                series = self._series.setdefault(name, deque(maxlen=_SERIES_KEPT))
                series.append((now, health.median_step_s))
        self.oom.sync(w.spec for w in self._watches.values())
        wall = self.clock.wall()
        for watch in list(self._watches.values()):
            self._advance(watch, newest.get(watch.spec.target), now, wall)
            if watch.saved < watch.changes and not watch.busy and now - watch.save_tried >= _SAVE_RETRY_S:
                watch.save_tried = now
                self._spawn(self._save(watch))

    def assess(self, workers: dict[int, Worker], now: float) -> Health:
        config = self._config()
        return assess(
            workers.values(),
            now,
            stall_min_s=config.stall_min_s,
            step_factor=config.stall_step_factor,
            lag_steps=config.lag_steps,
            heartbeat_s=config.poll_timeout_s,
        )

    async def _stall_stacks(self, key: tuple[str, str], trigger: Trigger) -> None:
        try:
            bundle = await self._take_stacks(key[0], key[1], False, trigger, False)
            # Shown with the run while it is live; a run that left meanwhile keeps nothing here.
            if self._registry.run_workers(key[0], key[1]):
                self.stall_stacks[key] = (bundle.id, bundle.summary)
        except RayprofError as e:
            logger.warning("rayprof controller: stacks of stalled %s failed: %s", key[0], e)

    def _baseline(self, target: str, since: float, until: float) -> float | None:
        values = [v for t, v in self._series.get(target, ()) if since <= t <= until]
        return statistics.median(values) if len(values) >= MIN_BASELINE_SAMPLES else None

    def _advance(
        self, watch: WatchRecord, run: tuple[dict[int, Worker], Health] | None, now: float, wall: datetime
    ) -> None:
        spec = watch.spec
        if watch.paused is not None:
            watch.state, watch.holding_since = "PAUSED", None
            return
        if run is None:
            watch.state, watch.holding_since, watch.observed, watch.note = "WAITING", None, None, _NOT_LIVE
            return
        if watch.note == _NOT_LIVE:  # a firing's failure note stays until the next firing
            watch.note = None
        workers, health = run
        if spec.oom and not any(w.info.device.startswith("cuda") for w in workers.values()):
            watch.note = _NO_CUDA
        elif watch.note == _NO_CUDA:  # a run with CUDA devices took the name since
            watch.note = None
        holds, trigger_args = self._condition(watch, health, now, wall)
        if not holds:
            watch.holding_since = None
            watch.state = "WAITING"
        else:
            watch.holding_since = watch.holding_since if watch.holding_since is not None else now
            watch.state = "HOLDING"
        blocked = self._blocked(watch, wall)
        if blocked is not None:
            watch.state = blocked
        hold_s = 0.0 if spec.every_s is not None or spec.oom else spec.for_s
        if not holds or now - (watch.holding_since or now) < hold_s or watch.busy or blocked is not None:
            return
        trigger = Trigger(watch_id=watch.id, at=wall, **trigger_args)
        watch.busy = True
        self._spawn(self._fire(watch, trigger, workers, health))

    def _condition(self, watch: WatchRecord, health: Health, now: float, wall: datetime) -> tuple[bool, dict[str, Any]]:
        spec = watch.spec
        if spec.oom:
            return self.oom.condition(spec, watch.fired[-1] if watch.fired else None)
        due = watch.next_at()
        if due is not None:
            watch.note = None
            since = (wall - watch.fired[-1]).total_seconds() if watch.fired else None
            watch.observed = since
            return wall >= due, dict(
                kind="schedule",
                observed=since,
                threshold=spec.every_s,
                detail=f"every {duration_text(spec.every_s or 0)}: due {due:%Y-%m-%d %H:%M:%S} UTC",
            )
        if spec.slower_than is not None:
            if watch.holding_since is None:
                # The baseline is frozen while the condition holds: slow samples never raise it.
                watch.baseline = self._baseline(spec.target, now - spec.baseline_s, now)
            watch.observed = health.median_step_s
            if watch.baseline is None or watch.observed is None:
                watch.note = "baseline warming up"
                return False, {}
            watch.note = None
            threshold = spec.slower_than * watch.baseline
            return watch.observed > threshold, dict(
                kind="slower_than",
                baseline=watch.baseline,
                observed=watch.observed,
                threshold=threshold,
                detail=f"median step time {watch.observed * 1000:.0f} ms > {spec.slower_than:g} x baseline "
                f"{watch.baseline * 1000:.0f} ms for {spec.for_s:g}s",
            )
        if spec.rank_lag is not None:
            watch.observed = float(health.most_behind)
            lagging = sorted(r for r, b in health.behind.items() if b >= spec.rank_lag)
            return bool(lagging), dict(
                kind="rank_lag",
                baseline=0.0,
                observed=watch.observed,
                threshold=float(spec.rank_lag),
                detail=f"ranks {lagging} at least {spec.rank_lag} steps behind the leader for {spec.for_s:g}s",
            )
        watch.observed = health.stalled_s
        return health.stalled, dict(
            kind="stalled",
            observed=health.stalled_s,
            threshold=health.threshold_s,
            detail=f"no rank advanced for {health.stalled_s:.0f}s (threshold {health.threshold_s:.0f}s)",
        )

    @staticmethod
    def _blocked(watch: WatchRecord, wall: datetime) -> str | None:
        """COOLDOWN or CAPPED when the watch may not fire now, else None. Failed firings count:
        a watch whose action keeps failing must not retry on every tick."""
        fired = watch.fired
        if fired and wall - fired[-1] < timedelta(seconds=watch.spec.cooldown_s):
            return "COOLDOWN"
        # fired holds at most max_per_hour times: when full, its oldest is the max_per_hour-th latest.
        if len(fired) >= watch.spec.max_per_hour and wall - fired[0] < timedelta(hours=1):
            return "CAPPED"
        return None

    async def _fire(self, watch: WatchRecord, trigger: Trigger, workers: dict[int, Worker], health: Health) -> None:
        spec = watch.spec
        firing: WatchFiring | None = None
        try:
            if spec.action == "stacks":
                bundle = await self._take_stacks(spec.target, None, False, trigger, spec.oom)
                error = f"stacks {bundle.id} ended FAILED" if bundle.state == ProfileState.FAILED else None
                firing = WatchFiring(at=trigger.at, profile_id=bundle.id, trigger=trigger, error=error)
            else:
                ranks = None
                if spec.ranks == "lagging" and spec.rank_lag is not None:
                    lagging = [r for r, b in health.behind.items() if b >= spec.rank_lag]
                    healthy = [r for r in sorted(workers) if r not in lagging][:_HEALTHY_BESIDE_LAGGING]
                    ranks = sorted(lagging + healthy)
                request = ProfileRequest(target=spec.target, steps=spec.profile_steps, ranks=ranks)
                status = await self._submit(request, trigger)
                firing = WatchFiring(at=trigger.at, profile_id=status.id, trigger=trigger)
            logger.info("rayprof controller: %s fired on %s: %s -> %s", watch.id, spec.target, trigger.detail, firing.profile_id)
        except ConflictError as e:
            # A window is already running on the target: try again on a later tick while it holds.
            watch.note = f"not fired yet: {e.message}"
        except RayprofError as e:
            firing = WatchFiring(at=trigger.at, trigger=trigger, error=e.message)
        except Exception as e:
            # Not one of ours: a bug. Recorded like any failure so the watch cools down and pauses
            # instead of failing again on every tick.
            logger.exception("rayprof controller: %s failed to fire", watch.id)
            firing = WatchFiring(at=trigger.at, trigger=trigger, error=f"internal error: {type(e).__name__}")
        finally:
            watch.busy = False
        if firing is None:
            return
        watch.firings = [*watch.firings, firing][-FIRINGS_KEPT:]
        watch.fired.append(firing.at)
        watch.holding_since = None
        self._count_failure(watch, firing.error)
        watch.changes += 1
        await self._save(watch)

    async def _save(self, watch: WatchRecord) -> None:
        """Save a watch's firings and pause; on a storage error, a later tick tries again."""
        if watch.id not in self._watches:
            return
        watch.save_tried = self.clock.monotonic()
        covered = watch.changes
        try:
            await self._persistence.save_watch(watch.status(watch.save_tried))
        except StorageError as e:
            logger.warning("rayprof controller: cannot save %s (will retry): %s", watch.id, e)
            return
        watch.saved = max(watch.saved, covered)

    def _count_failure(self, watch: WatchRecord, error: str | None) -> None:
        if error is None:
            watch.failures = 0
            return
        watch.failures += 1
        limit = self._config().watch_max_failures
        if watch.failures >= limit and watch.paused is None:
            watch.paused = (
                f"its action failed {watch.failures} times in a row (RAYPROF_WATCH_MAX_FAILURES={limit}); last: "
                f"{error}. Delete the watch and create it again once that is fixed"
            )
            logger.warning("rayprof controller: %s paused: %s", watch.id, watch.paused)
