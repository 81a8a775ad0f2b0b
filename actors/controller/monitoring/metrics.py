"""The controller's metrics through Ray's metrics API (``ray.util.metrics``).

Ray exports them from every node's metrics agent, so they reach Ray's
Prometheus and Grafana with no setup of ours. Gauges are set on the monitor
tick from the heartbeats already held (never on a rank's step path), when
their value changed or :data:`GAUGE_REFRESH_S` after they were last set: at
1,024 ranks setting every gauge on every tick would make thousands of calls
into Ray's metrics core for nothing. Counters and
histograms are recorded when a profile, a stacks bundle, a watch firing or a
post-window check ends.

Ray 2.60's metrics agent drops a gauge's label set that was not set for two
export periods (20 s by default; Ray 2.43's kept it for the life of the
process), so an unchanged gauge (a target that stays not STALLED) is set
again on the refresh period. When a target or one of its ranks leaves, its
state gauges (stalled, lagging, ranks, steps behind, seconds since a step)
are set once to 0, their final value, and never again: on 2.60 the label set
then ages out; on 2.43 it stays at 0, so an alert on it clears instead of
firing for the life of the controller. Step times and post-window ratios keep
their last value, which was the run's last measurement.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from actors.controller.agents.registry import Worker
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import metric_names as m
from actors.controller.profiles.state import Profile
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import Trigger

__all__ = ["Metrics"]

_MEDIAN_OF = 16
# Under half of Ray's default export period (10 s), so every export carries every live label set.
GAUGE_REFRESH_S = 5.0


def _make(metric: m.MetricDef) -> Any:
    from ray.util.metrics import Counter, Gauge, Histogram

    if metric.kind == "gauge":
        return Gauge(metric.name, metric.description, tag_keys=metric.tags)
    if metric.kind == "counter":
        return Counter(metric.name, metric.description, tag_keys=metric.tags)
    return Histogram(metric.name, metric.description, boundaries=m.DURATION_BOUNDARIES_S, tag_keys=metric.tags)


# What a state gauge says once its target or rank has left: nothing stalled, lagging or behind.
_FINAL = {d.name: 0.0 for d in (m.STALLED, m.LAGGING, m.RANKS, m.STEPS_BEHIND, m.SINCE_STEP)}


def trigger_label(trigger: Trigger | None) -> str:
    return trigger.kind if trigger is not None else "manual"


class Metrics:
    """One controller's metric objects, and the last value set per gauge and label set."""

    def __init__(self) -> None:
        self._m = {d.name: _make(d) for d in m.METRICS}
        # (metric, labels) -> (value, when it was set, by the tick's clock)
        self._last: dict[tuple[str, tuple[str, ...]], tuple[float, float]] = {}
        self._post_window: dict[str, dict[int, float]] = {}
        self._step_times: dict[tuple[str, int], deque[float]] = {}
        self._seen: dict[tuple[str, int], float] = {}
        # Target -> the ranks its per-rank gauges were set for: a rank that leaves gets its final values.
        self._ranks: dict[str, set[int]] = {}

    def _gauge(self, metric: m.MetricDef, now: float, value: float, *labels: str) -> None:
        key = (metric.name, labels)
        last = self._last.get(key)
        if last is not None and last[0] == value and now - last[1] < GAUGE_REFRESH_S:
            return
        self._last[key] = (value, now)
        self._m[metric.name].set(value, tags=dict(zip(metric.tags, labels, strict=True)))

    def _count(self, metric: m.MetricDef, value: float, *labels: str) -> None:
        if value > 0:
            self._m[metric.name].inc(value, tags=dict(zip(metric.tags, labels, strict=True)))

    def _observe(self, metric: m.MetricDef, value: float, *labels: str) -> None:
        self._m[metric.name].observe(max(0.0, value), tags=dict(zip(metric.tags, labels, strict=True)))

    def run(self, target: str, workers: dict[int, Worker], health: Health, now: float) -> None:
        """One tick's gauges for the newest run of ``target``."""
        ranks = self._ranks.setdefault(target, set())
        for left in ranks - workers.keys():
            self._end(target, str(left))
        ranks.intersection_update(workers.keys())
        ranks.update(workers.keys())
        self._gauge(m.STALLED, now, 1.0 if health.stalled else 0.0, target)
        self._gauge(m.LAGGING, now, float(len(health.lagging)), target)
        self._gauge(m.RANKS, now, float(len(workers)), target)
        for rank, ratio in self._post_window.get(target, {}).items():
            self._gauge(m.POST_WINDOW_RATIO, now, ratio, target, str(rank))
        for rank, w in workers.items():
            r = str(rank)
            # Whole seconds: the value (and a call into Ray) changes once a second, not every tick.
            self._gauge(m.SINCE_STEP, now, float(int(now - w.advanced_at)), target, r)
            self._gauge(m.STEPS_BEHIND, now, float(health.behind.get(rank, 0)), target, r)
            if w.step_time_s is None:
                continue
            self._gauge(m.STEP_TIME, now, w.step_time_s, target, r)
            key = (target, rank)
            if self._seen.get(key) != w.seen_at:
                self._seen[key] = w.seen_at
                recent = self._step_times.setdefault(key, deque(maxlen=_MEDIAN_OF))
                recent.append(w.step_time_s)
                self._gauge(m.STEP_TIME_MEDIAN, now, statistics.median(recent), target, r)

    def forget(self, targets: set[str]) -> None:
        """Targets no longer live: their state gauges get their final value, and what is held goes."""
        # Every target with gauges went through run(), which noted it in _ranks.
        for target in self._ranks.keys() - targets:
            self._end(target, None)
            del self._ranks[target]
        for target in self._post_window.keys() - targets:
            del self._post_window[target]

    def _end(self, target: str, rank: str | None) -> None:
        """Set the final value of ``target``'s gauges (of its ``rank`` only, when given) and stop setting them."""
        for key in [k for k in self._last if k[1][0] == target and (rank is None or k[1][1:] == (rank,))]:
            name, labels = key
            del self._last[key]
            if name in _FINAL:
                metric = next(d for d in m.METRICS if d.name == name)
                self._m[name].set(_FINAL[name], tags=dict(zip(metric.tags, labels, strict=True)))
        for key in [k for k in self._step_times if k[0] == target and (rank is None or str(k[1]) == rank)]:
            del self._step_times[key]
            self._seen.pop(key, None)

    def label_sets(self) -> int:
        """Gauge label sets being set (exported) now: what Prometheus holds of live runs."""
        return len(self._last)

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
