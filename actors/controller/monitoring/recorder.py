"""What sets the controller's gauges: a small Ray actor beside it that it replaces to forget ended runs, or
the controller's own process where Ray forgets idle gauges by itself.

Ray exports a gauge's label set from the process that set it. Ray 2.43's
metrics agent exports it for as long as that process lives (it forgets a
process 60 s after it ends, ``clean_stale_components``): set in the controller's
own process (months of life, label sets per run and rank), an ended run's
gauges piled up in Prometheus. There the gauges live in a process of their own
(:class:`RayRecorder`) that the controller replaces
(:mod:`actors.controller.monitoring.series`): what ended leaves with the old
process. Where the agent drops a gauge not set for a while (the OpenTelemetry
agent's TTL, Ray 2.60: :func:`orchestrator.ray_compat.agent_forgets_idle_gauges`)
a gauge that is set no more leaves by itself, and the controller sets them in
its own process (:class:`InProcessRecorder`): a separate one would cost a Ray
worker (~150 MiB, ~1.5 % of a core here) for nothing. Counters and histograms
stay in the controller's process: Ray 2.60's agent keeps every counter it was
sent for its own life, a dead process's too, so a replaced process would leave
a copy of every live count behind.

The recorder sets what the controller sends (:class:`MetricUpdate`) and sets
every live gauge again each :data:`GAUGE_REFRESH_S`, so a TTL keeps an
unchanged one; an ended gauge is set once and never again. Ray's series carry
the recording worker's ``WorkerId``: a new process's series are new series, and
during a replacement both processes' can show for up to two minutes (the old
one's copies of live gauges then read 0; the dashboard takes ``max``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from actors.controller.monitoring import metric_names as m

__all__ = [
    "GAUGE_REFRESH_S",
    "InProcessRecorder",
    "MetricRecorder",
    "MetricUpdate",
    "RayRecorder",
    "Recorder",
    "SeriesKey",
    "default_recorder",
]

# Under half of Ray's default export period (10 s), so every export carries every live label set.
GAUGE_REFRESH_S = 5.0

SeriesKey = tuple[str, tuple[str, ...]]
"""A metric's name and its label values, in its tag keys' order (``target`` first)."""

class MetricUpdate(BaseModel):
    """What the controller sends its recorder: gauges set to a new value, then gauges that ended."""

    model_config = ConfigDict(frozen=True)

    gauges: list[tuple[str, tuple[str, ...], float]] = []
    ended: list[tuple[str, tuple[str, ...], float | None]] = []
    """Gauges set once more to the value given (None: left at the last one), then no more."""


def _ray_gauge(metric: m.MetricDef) -> Any:
    from ray.util.metrics import Gauge

    return Gauge(metric.name, metric.description, tag_keys=metric.tags)


class MetricRecorder:
    """The gauges and their live values, in the process that exports them. ``make_gauge`` is a seam for
    tests that keep what is set; :meth:`serve` refreshes on a thread in the Ray actor."""

    def __init__(self, make_gauge: Callable[[m.MetricDef], Any] = _ray_gauge) -> None:
        self._defs = {d.name: d for d in m.METRICS if d.kind == "gauge"}
        self._metrics = {name: make_gauge(d) for name, d in self._defs.items()}
        self._live: dict[SeriesKey, float] = {}
        # The refresh thread and update calls both set gauges and read _live.
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def _tags(self, name: str, labels: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(self._defs[name].tags, labels, strict=True))

    def update(self, update: MetricUpdate) -> None:
        with self._lock:
            for name, labels, value in update.gauges:
                self._live[(name, labels)] = value
                self._metrics[name].set(value, tags=self._tags(name, labels))
            for name, labels, final in update.ended:
                self._live.pop((name, labels), None)
                if final is not None:
                    self._metrics[name].set(final, tags=self._tags(name, labels))

    def refresh(self) -> None:
        """Set every live gauge again (Ray 2.60 drops one not set for two export periods)."""
        with self._lock:
            for (name, labels), value in self._live.items():
                self._metrics[name].set(value, tags=self._tags(name, labels))

    def serve(self, period_s: float) -> None:
        """Refresh every ``period_s`` on a daemon thread, until :meth:`stop` (or the process's end)."""

        def loop() -> None:
            while not self._stopped.wait(period_s):
                self.refresh()

        threading.Thread(target=loop, name="rayprof-gauge-refresh", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()


class Recorder(Protocol):
    """A recorder as the controller reaches it: a send answered later, and an end."""

    own_process: bool
    """Whether ending it makes Ray forget what it set: only then is it replaced to drop ended runs."""

    def send(self, update: MetricUpdate) -> Future[None]: ...

    def close(self) -> None: ...


class _RecorderActor(MetricRecorder):
    def __init__(self, period_s: float) -> None:
        super().__init__()
        self.serve(period_s)


class InProcessRecorder:
    """A :class:`MetricRecorder` in the controller's process, for a Ray whose agent forgets idle gauges."""

    own_process = False

    def __init__(self) -> None:
        self._recorder = MetricRecorder()
        self._recorder.serve(GAUGE_REFRESH_S)

    def send(self, update: MetricUpdate) -> Future[None]:
        done: Future[None] = Future()
        self._recorder.update(update)
        done.set_result(None)
        return done

    def close(self) -> None:
        self._recorder.stop()


class RayRecorder:
    """A :class:`MetricRecorder` in a Ray actor of its own on the controller's node. Not detached: it ends
    with the controller (a restarted controller starts its own)."""

    own_process = True

    def __init__(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        actor_cls = ray.remote(_RecorderActor)
        self._actor: Any = actor_cls.options(num_cpus=0, max_restarts=0, scheduling_strategy=here).remote(GAUGE_REFRESH_S)

    def send(self, update: MetricUpdate) -> Future[None]:
        future: Future[None] = self._actor.update.remote(update).future()
        return future

    def close(self) -> None:
        import ray

        ray.kill(self._actor, no_restart=True)


def default_recorder() -> Callable[[], Recorder]:
    """The recorder this Ray release needs (:func:`orchestrator.ray_compat.agent_forgets_idle_gauges`)."""
    from orchestrator.ray_compat import agent_forgets_idle_gauges

    return InProcessRecorder if agent_forgets_idle_gauges() else RayRecorder
