"""The controller's telemetry: metrics, step-time history and the post-window check, on the monitor tick.

Everything here reads what the controller already holds (heartbeats,
profiles, watches); nothing calls a rank, and the poll handlers are
untouched. The controller calls :meth:`Telemetry.tick` from its monitor
loop, :meth:`bundle_ended` when a profile or stacks bundle ends, and wraps
its postprocess with :meth:`timed`. Heartbeats are dated, and checks and saves
timed, on the controller's clock (:mod:`actors.controller.clock`), so a test
steps the history instead of waiting for it to fill.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from actors.controller.agents.registry import Registry, Worker
from actors.controller.clock import Clock
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import history_answer
from actors.controller.monitoring.metrics import Metrics
from actors.controller.monitoring.post_window_check import PostWindowChecks
from actors.controller.monitoring.recorder import Recorder
from actors.controller.monitoring.step_history import History, RunHistory
from actors.controller.profiles.state import Profile
from actors.controller.saved.history_store import HistoryStore
from orchestrator.errors import StorageError, TargetNotFoundError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig
from orchestrator.models.diagnosis import WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import Manifest

__all__ = ["Telemetry"]

logger = logging.getLogger(__name__)

PostprocessFn = Callable[[Manifest, Profile, float], Awaitable[Manifest]]


_UNSEEN = object()


class Telemetry:
    def __init__(
        self,
        registry: Registry,
        home: StorageSpec,
        cluster: str,
        config: Callable[[], ControllerConfig],
        assess: Callable[[dict[int, Worker], float], Health],
        save_profile: Callable[[Profile], Awaitable[None]],
        known: Callable[[str], bool],
        spawn: Callable[[Any], Any],
        clock: Clock,
        recorder: Callable[[], Recorder],
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._config = config
        self._assess = assess
        self._save_profile = save_profile
        self._known = known
        self._spawn = spawn
        self._store = HistoryStore(home, cluster)
        self.history = History()
        self._metrics = Metrics(recorder, lambda: config().metrics_ended_kept_s) if config().metrics else None
        self._checks = PostWindowChecks(
            self.history,
            lambda: (config().post_window_slowdown, config().post_window_steps, config().monitor_interval_s),
            self._check_ended,
        )
        # None: the saved histories are not read yet; the history records nothing until they are.
        self._loaded: bool | None = None
        self._saved_at = clock.monotonic()
        self._saving = False
        self._last_firing: dict[str, Any] = {}
        self._postprocess_s: dict[str, float] = {}

    # ---- hooks ------------------------------------------------------------

    def timed(self, postprocess: PostprocessFn) -> PostprocessFn:
        """``postprocess``, remembering how long each profile's took."""

        async def run(manifest: Manifest, profile: Profile, timeout_s: float) -> Manifest:
            # The work's own duration, on the process's clock: no test steps a postprocess.
            started = time.monotonic()
            try:
                return await postprocess(manifest, profile, timeout_s)
            finally:
                self._postprocess_s[profile.id] = time.monotonic() - started

        return run

    def bundle_ended(self, profile: Profile) -> None:
        postprocess_s = self._postprocess_s.pop(profile.id, None)
        if self._config().history and self._loaded:
            self._checks.track(profile, self._wall())  # a window shorter than a tick was never seen live
        if self._metrics is not None:
            self._metrics.bundle_ended(profile, postprocess_s)

    def resume_check(self, profile: Profile) -> None:
        """A finished profile whose post-window check was in progress when the controller restarted:
        followed again from when it finished (it gives up, ``unknown``, when the history is gone)."""
        since = profile.finished_at.timestamp() if profile.finished_at is not None else self._wall()
        if self._config().history:
            self._checks.track(profile, since)
            return
        self._checks.end(profile)  # no history is kept: nothing would ever decide it

    def _wall(self) -> float:
        return self._clock.wall().timestamp()

    def _check_ended(self, profile: Profile, check: PostWindowCheck) -> None:
        if self._metrics is not None:
            self._metrics.post_window(profile.target, check)
        if profile.state.is_terminal:
            # An unfinished profile's manifest and saved state take the check when it ends.
            self._spawn(self._save_ended(profile))

    async def _save_ended(self, profile: Profile) -> None:
        if not self._known(profile.id):
            return  # deleted meanwhile: saving would bring its state file back
        try:
            await self._save_profile(profile)
        except StorageError as e:
            logger.warning("rayprof controller: cannot save the post-window check of %s: %s", profile.id, e)

    # ---- the tick ---------------------------------------------------------

    def tick(self, now: float, live: Iterable[Profile], watches: list[WatchStatus]) -> None:
        config = self._config()
        wall = self._wall()
        if config.history:
            self._history_tick(now, wall, config)
            if self._loaded:
                self._checks.tick(live, wall)
        if self._metrics is not None:
            self._metrics_tick(now, watches)

    def _history_tick(self, now: float, wall: float, config: ControllerConfig) -> None:
        if self._loaded is None:
            self._loaded = False
            self._spawn(self._load())
            return
        if not self._loaded:
            return
        self.history.record(self._registry.workers.values(), now, wall)
        for run in self.history.forget_ended(wall, config.ended_run_kept_s):
            self._spawn(self._delete(run))
        if now - self._saved_at >= config.history_save_interval_s and not self._saving:
            self._saved_at = now
            self._spawn(self.save())

    def _metrics_tick(self, now: float, watches: list[WatchStatus]) -> None:
        assert self._metrics is not None
        names = self._registry.names()
        for name in names:
            workers = next(iter(self._registry.runs(name).values()))  # the newest run
            self._metrics.run(name, workers, self._assess(workers, now), now)
        self._metrics.forget(set(names), now)
        for gone in self._last_firing.keys() - {w.id for w in watches}:
            del self._last_firing[gone]
        for watch in watches:
            # Firings are kept to the last few: the new ones are those after the last seen. A watch
            # seen for the first time (just made, or restored) counts none of what it had.
            last = self._last_firing.get(watch.id, _UNSEEN)
            self._last_firing[watch.id] = max((f.at for f in watch.firings), default=None)
            if last is _UNSEEN:
                continue
            for f in watch.firings:
                if last is None or f.at > last:
                    self._metrics.watch_fired(watch.spec.target, watch.spec.condition, f.error is not None)
        self._metrics.flush(now)

    # ---- storage ----------------------------------------------------------

    async def _load(self) -> None:
        try:
            for run in await self._store.load():
                self.history.adopt(run)
        except StorageError as e:
            logger.warning("rayprof controller: cannot read saved step-time histories (starting afresh): %s", e)
        self._loaded = True

    async def save(self) -> None:
        """Save every run's history now; a failure is logged, and the next interval tries again."""
        self._saving = True
        try:
            await self._store.save(list(self.history.runs.values()))
        except StorageError as e:
            logger.warning("rayprof controller: cannot save step-time histories: %s", e)
        finally:
            self._saving = False

    async def _delete(self, run: RunHistory) -> None:
        try:
            await self._store.delete(run)
        except StorageError as e:
            logger.warning("rayprof controller: cannot delete the history of %s: %s", run.target, e)

    # ---- the API ----------------------------------------------------------

    async def view(
        self, target: str, run: str | None, span_s: float, ranks: list[int] | None, max_points: int
    ) -> TargetHistory:
        """One run's history over the last ``span_s``: the named run, else the newest live one,
        else the one heard from last; downsampled past ``max_points``, and built in a thread."""
        live = self._registry.runs(target)
        if run is None:
            runs = [r for (t, _), r in self.history.runs.items() if t == target]
            found = self.history.runs.get((target, next(iter(live)))) if live else None
            if found is None and runs:
                found = max(runs, key=lambda r: r.last_t)
        else:
            found = self.history.runs.get((target, run))
        if found is None:
            newest = next(iter(live), None)
            if newest is None or run not in (None, *live):
                raise TargetNotFoundError(f"no step-time history for {target!r}" + (f" run {run!r}" if run else ""), target=target)
            # Live but no point yet (just registered, or history off): empty, not unknown.
            found = RunHistory(target, run or newest)
        snapshot = found.snapshot(span_s, self._wall(), ranks)
        return await asyncio.to_thread(history_answer.answer, snapshot, max_points)
