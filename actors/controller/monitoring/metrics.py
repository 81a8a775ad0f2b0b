"""The controller's metrics through Ray's metrics API (``ray.util.metrics``): what each one records, and when.

Ray exports them from every node's metrics agent, so they reach Ray's
Prometheus and Grafana with no setup of ours. Gauges are computed on the
monitor tick from the heartbeats already held (never on a rank's step path)
and handed to :class:`~actors.controller.monitoring.series.Series`, which
sends what changed to the recorder process that exports them: at 1,024 ranks
setting every gauge on every tick would make thousands of calls for nothing.
Counters and histograms are recorded here, in the controller's process, when
a profile, a stacks bundle, a watch firing or a post-window check ends.

When a target or one of its ranks leaves, its gauges are set no more: the
state gauges (stalled, lagging, ranks, steps behind, seconds since a step)
once more to 0, their final value, so an alert on them clears; step times and
post-window ratios keep their last value, the run's last measurement. The
recorder process that still exports them is replaced a few minutes later,
and Ray forgets them with it (:mod:`actors.controller.monitoring.recorder`).
An ended run's counters stay: no Ray release forgets a counter's label set.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

from actors.controller.agents.registry import Worker
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.recorder import Recorder
from actors.controller.monitoring.series import Series
from actors.controller.profiles.state import Profile
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import Trigger

__all__ = ["Metrics"]

_MEDIAN_OF = 16


def _make(metric: m.MetricDef) -> Any:
    from ray.util.metrics import Counter, Histogram

    if metric.kind == "counter":
        return Counter(metric.name, metric.description, tag_keys=metric.tags)
    return Histogram(metric.name, metric.description, boundaries=m.DURATION_BOUNDARIES_S, tag_keys=metric.tags)


# What a state gauge says once its target or rank has left: nothing stalled, lagging or behind.
_FINAL = {d.name: 0.0 for d in (m.STALLED, m.LAGGING, m.RANKS, m.STEPS_BEHIND, m.SINCE_STEP)}


def trigger_label(trigger: Trigger | None) -> str:
    return trigger.kind if trigger is not None else "manual"


class Metrics:
    """One controller's counters and histograms, and its gauges' values (``recorder`` starts the process
    that exports them; ``hold_s``: how long an ended run's gauges stay exported)."""

    def __init__(self, recorder: Callable[[], Recorder], hold_s: Callable[[], float]) -> None:
        self._m = {d.name: _make(d) for d in m.METRICS if d.kind != "gauge"}
        self.series = Series(recorder, hold_s)
        self._post_window: dict[str, dict[int, float]] = {}
        self._step_times: dict[tuple[str, int], deque[float]] = {}
        self._seen: dict[tuple[str, int], float] = {}
        # Target -> the ranks its per-rank gauges were set for: a rank that leaves gets its final values.
        self._ranks: dict[str, set[int]] = {}

    def _gauge(self, metric: m.MetricDef, value: float, *labels: str) -> None:
        self.series.gauge((metric.name, labels), value)

    def _count(self, metric: m.MetricDef, value: float, *labels: str) -> None:
        if value > 0:
            self._m[metric.name].inc(value, tags=dict(zip(metric.tags, labels, strict=True)))

    def _observe(self, metric: m.MetricDef, value: float, *labels: str) -> None:
        self._m[metric.name].observe(max(0.0, value), tags=dict(zip(metric.tags, labels, strict=True)))

    def run(self, target: str, workers: dict[int, Worker], health: Health, now: float) -> None:
        """One tick's gauges for the newest run of ``target``."""
        ranks = self._ranks.setdefault(target, set())
        for left in ranks - workers.keys():
            self._end(target, str(left), now)
        ranks.intersection_update(workers.keys())
        ranks.update(workers.keys())
        self._gauge(m.STALLED, 1.0 if health.stalled else 0.0, target)
        self._gauge(m.LAGGING, float(len(health.lagging)), target)
        self._gauge(m.RANKS, float(len(workers)), target)
        for rank, ratio in self._post_window.get(target, {}).items():
            self._gauge(m.POST_WINDOW_RATIO, ratio, target, str(rank))
        for rank, w in workers.items():
            r = str(rank)
            # Whole seconds: the value (and a call into Ray) changes once a second, not every tick.
            self._gauge(m.SINCE_STEP, float(int(now - w.advanced_at)), target, r)
            self._gauge(m.STEPS_BEHIND, float(health.behind.get(rank, 0)), target, r)
            if w.step_time_s is None:
                continue
            self._gauge(m.STEP_TIME, w.step_time_s, target, r)
            key = (target, rank)
            if self._seen.get(key) != w.seen_at:
                self._seen[key] = w.seen_at
                recent = self._step_times.setdefault(key, deque(maxlen=_MEDIAN_OF))
                recent.append(w.step_time_s)
                self._gauge(m.STEP_TIME_MEDIAN, statistics.median(recent), target, r)

    def forget(self, targets: set[str], now: float) -> None:
        """Targets no longer live: their state gauges get their final value, and what is held goes."""
        # Every target with gauges went through run(), which noted it in _ranks.
        for target in self._ranks.keys() - targets:
            self._end(target, None, now)
            del self._ranks[target]
        for target in self._post_window.keys() - targets:
            del self._post_window[target]

    def _end(self, target: str, rank: str | None, now: float) -> None:
        """Set the final value of ``target``'s gauges (of its ``rank`` only, when given) and stop setting them."""
        ended = [k for k in self.series.live() if k[1][0] == target and (rank is None or k[1][1:] == (rank,))]
        self.series.end(ended, _FINAL, now)
        for key in [k for k in self._step_times if k[0] == target and (rank is None or str(k[1]) == rank)]:
            del self._step_times[key]
            self._seen.pop(key, None)

    def flush(self, now: float) -> None:
        """The tick's gauge changes to the recorder (and the recorder replaced, when due)."""
        self.series.flush(now)

    def label_sets(self) -> int:
        """Gauge label sets being set (exported) now: what Prometheus holds of live runs."""
        return len(self.series.live())

    def bundle_ended(self, profile: Profile, postprocess_s: float | None) -> None:
        """A profile or stacks bundle reached its terminal state."""
        target, ranks = profile.target, list(profile.ranks.values())
        metric = m.PROFILES if profile.kind == "profile" else m.STACKS
        self._count(metric, 1.0, target, profile.state.value, trigger_label(profile.trigger))
        self._count(m.CAPTURED_BYTES, float(sum(r.trace_bytes or 0 for r in ranks)), target)
        if profile.manifest is not None:
            self._count(m.STORED_BYTES, float(sum(a.bytes for a in profile.manifest.all_artifacts())), target)
        ends = [r.capture_ended_at for r in ranks if r.capture_ended_at is not None]
        if isinstance(profile, Profile) and profile.capture_started_at is not None and ends:
            self._observe(m.WINDOW_DURATION, (max(ends) - profile.capture_started_at).total_seconds(), target)
        if postprocess_s is not None:
            self._observe(m.POSTPROCESS_DURATION, postprocess_s, target)

    def watch_fired(self, target: str, condition: str, failed: bool) -> None:
        self._count(m.WATCH_FIRINGS, 1.0, target, condition, "error" if failed else "ok")

    def post_window(self, target: str, check: PostWindowCheck) -> None:
        self._count(m.POST_WINDOW_CHECKS, 1.0, target, check.verdict)
        # Set on the next tick, and again on the refresh period while the target is live.
        self._post_window[target] = {r.rank: r.ratio for r in check.ranks if r.ratio is not None}
