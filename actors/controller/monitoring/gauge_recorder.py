"""The process that holds the controller's gauges: a small Ray actor beside it, replaced to forget ended runs.

Ray exports a gauge's label set from the process that set it. Ray 2.43's
metrics agent forgets a label set only when that process stops reporting (60 s
after it ends, ``clean_stale_components``), so a gauge set in the controller's
own process (months of life, a label set per run and rank) was exported for
ever: an ended run's ``rayprof_stalled`` and per-rank series piled up in
Prometheus. Ray 2.60's agent drops a label set that was not set for two export
periods instead. So the gauges live in a process of their own that the
controller replaces (:mod:`actors.controller.monitoring.gauges`): what ended
leaves with the old process, on every supported Ray release.

The recorder sets what the controller sends (:class:`GaugeUpdate`: the values
that changed, and the label sets that ended with their final value) and sets
every live label set again each :data:`GAUGE_REFRESH_S` so Ray 2.60 keeps an
unchanged one; an ended label set is set once and never again. The Ray series
carry the recording worker's ``WorkerId``: the new process's series are new
series, and during a replacement both processes' can show for up to two
minutes (the dashboard's per-rank panels take ``max by (target, rank)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from actors.controller.monitoring import metric_names as m

__all__ = ["GAUGE_REFRESH_S", "GaugeRecorder", "GaugeUpdate", "RayRecorder", "Recorder"]

# Under half of Ray's default export period (10 s), so every export carries every live label set.
GAUGE_REFRESH_S = 5.0

GaugeKey = tuple[str, tuple[str, ...]]
"""A gauge's name and its label values, in its tag keys' order."""


class GaugeUpdate(BaseModel):
    """What the controller sends its recorder: label sets set to a new value, and label sets that ended."""

    model_config = ConfigDict(frozen=True)

    values: list[tuple[str, tuple[str, ...], float]] = []
    ended: list[tuple[str, tuple[str, ...], float | None]] = []
    """Set once more to the value given (None: left at its last value), then no more."""


def _ray_gauge(metric: m.MetricDef) -> Any:
    from ray.util.metrics import Gauge

    return Gauge(metric.name, metric.description, tag_keys=metric.tags)


class GaugeRecorder:
    """The gauges and their live values, in the process that exports them. ``make_gauge`` is a seam for
    tests that record what would be set; :meth:`serve` refreshes on its own thread in the Ray actor."""

    def __init__(self, make_gauge: Callable[[m.MetricDef], Any] = _ray_gauge) -> None:
        self._defs = {d.name: d for d in m.METRICS if d.kind == "gauge"}
        self._gauges = {name: make_gauge(d) for name, d in self._defs.items()}
        self._live: dict[GaugeKey, float] = {}
        # The refresh thread and update calls both set gauges and read _live.
        self._lock = threading.Lock()

    def _set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        self._gauges[name].set(value, tags=dict(zip(self._defs[name].tags, labels, strict=True)))

    def update(self, update: GaugeUpdate) -> None:
        with self._lock:
            for name, labels, value in update.values:
                self._live[(name, labels)] = value
                self._set(name, labels, value)
            for name, labels, final in update.ended:
                self._live.pop((name, labels), None)
                if final is not None:
                    self._set(name, labels, final)

    def refresh(self) -> None:
        """Set every live label set again (Ray 2.60 drops one not set for two export periods)."""
        with self._lock:
            for (name, labels), value in self._live.items():
                self._set(name, labels, value)

    def serve(self, period_s: float) -> None:
        """Refresh every ``period_s`` on a daemon thread, for the life of the process."""
        stop = threading.Event()  # never set: the process's end stops the thread

        def loop() -> None:
            while not stop.wait(period_s):
                self.refresh()

        threading.Thread(target=loop, name="rayprof-gauge-refresh", daemon=True).start()


class Recorder(Protocol):
    """A recorder as the controller reaches it: a send answered later, and an end."""

    def send(self, update: GaugeUpdate) -> Future[None]: ...

    def close(self) -> None: ...


class _RecorderActor(GaugeRecorder):
    def __init__(self, period_s: float) -> None:
        super().__init__()
        self.serve(period_s)


class RayRecorder:
    """A :class:`GaugeRecorder` in a Ray actor of its own on the controller's node. Not detached: it ends
    with the controller (a restarted controller starts its own)."""

    def __init__(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        actor_cls = ray.remote(_RecorderActor)
        self._actor: Any = actor_cls.options(num_cpus=0, max_restarts=0, scheduling_strategy=here).remote(GAUGE_REFRESH_S)

    def send(self, update: GaugeUpdate) -> Future[None]:
        future: Future[None] = self._actor.update.remote(update).future()
        return future

    def close(self) -> None:
        import ray

        ray.kill(self._actor, no_restart=True)
