"""The controller's gauge recorder run in the test's own process: the real recorder, metrics that remember."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.recorder import MetricRecorder, MetricUpdate


class RecordingMetric:
    """Stands in for one ray.util.metrics object: what was recorded, with which tags."""

    def __init__(self, metric: m.MetricDef | None = None) -> None:
        self.calls: list[tuple[float, dict[str, str]]] = []

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append((value, tags))

    inc = observe = set


class LocalRecorder:
    """A :class:`MetricRecorder` here: a send is answered at once (or held, or failed, as a test says). It
    stands for a process of its own (``own_process``), whose end makes Ray forget what it set."""

    def __init__(self, own_process: bool = True, metric: Callable[[m.MetricDef], Any] = RecordingMetric) -> None:
        self.own_process = own_process
        self._make = metric
        self.metrics: dict[str, Any] = {}
        self.recorder = MetricRecorder(make_gauge=self._metric)
        self.updates: list[MetricUpdate] = []
        self.closed = False
        self.answer = True  # False: sends stay unanswered
        self.fail: Exception | None = None

    def _metric(self, metric: m.MetricDef) -> Any:
        self.metrics[metric.name] = self._make(metric)
        return self.metrics[metric.name]

    def send(self, update: MetricUpdate) -> Future[None]:
        assert not self.closed, "sent to a recorder that was ended"
        future: Future[None] = Future()
        self.updates.append(update)
        if self.fail is not None:
            future.set_exception(self.fail)
        elif self.answer:
            self.recorder.update(update)
            future.set_result(None)
        return future

    def close(self) -> None:
        self.closed = True

    def exported(self) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        """Every (metric, labels) this process ever recorded: what Ray exports while it runs."""
        return {(name, tuple(sorted(tags.items()))) for name, r in self.metrics.items() for _, tags in r.calls}


class LocalRecorders:
    """Starts local recorders, as the controller's ``recorder`` seam; remembers each. ``metric`` makes the
    stand-in for one Ray gauge (one that remembers every call, unless told otherwise)."""

    def __init__(self, own_process: bool = True, metric: Callable[[m.MetricDef], Any] = RecordingMetric) -> None:
        self.started: list[LocalRecorder] = []
        self._own_process = own_process
        self._metric = metric

    def __call__(self) -> LocalRecorder:
        self.started.append(LocalRecorder(self._own_process, self._metric))
        return self.started[-1]

    def running(self) -> list[LocalRecorder]:
        return [r for r in self.started if not r.closed]

    def calls(self, metric: m.MetricDef) -> list[tuple[float, dict[str, str]]]:
        """What the gauge ``metric`` was set to, in every recorder started, in order."""
        return [c for r in self.started for c in r.metrics[metric.name].calls]
