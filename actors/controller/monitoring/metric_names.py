"""Every metric the controller exports through Ray's metrics API: the one list of names.

The controller registers these; the Grafana dashboard's test checks its
queries against them. Ray's exporter puts ``ray_`` before every name, adds
``_total`` to counters, and ``_bucket``/``_sum``/``_count`` to histograms;
:func:`exported` gives the series names Prometheus holds. Labels are bounded:
target names, ranks, outcomes and trigger kinds, never a profile id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DURATION_BOUNDARIES_S", "METRICS", "RAY_PREFIX", "MetricDef", "exported"]

RAY_PREFIX = "ray_"
DURATION_BOUNDARIES_S = [0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800]

Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Kind
    description: str
    tags: tuple[str, ...]


STEP_TIME = MetricDef(
    "rayprof_step_time_seconds", "gauge", "A rank's latest step time, from its heartbeat.", ("target", "rank")
)
STEP_TIME_MEDIAN = MetricDef(
    "rayprof_step_time_median_seconds", "gauge", "Median of a rank's last 16 heartbeat step times.", ("target", "rank")
)
STEPS_BEHIND = MetricDef(
    "rayprof_steps_behind", "gauge", "Steps a rank is behind the leading rank, at one instant.", ("target", "rank")
)
SINCE_STEP = MetricDef(
    "rayprof_seconds_since_step", "gauge", "Seconds since a rank's step count last went up.", ("target", "rank")
)
STALLED = MetricDef("rayprof_stalled", "gauge", "1 while no rank of the target advanced for the stall threshold.", ("target",))
LAGGING = MetricDef("rayprof_lagging_ranks", "gauge", "Ranks at least RAYPROF_LAG_STEPS behind the leader.", ("target",))
RANKS = MetricDef("rayprof_ranks", "gauge", "Live ranks with an agent.", ("target",))
PROFILES = MetricDef(
    "rayprof_profiles", "counter", "Profile windows ended, by outcome and trigger.", ("target", "outcome", "trigger")
)
STACKS = MetricDef(
    "rayprof_stacks_bundles", "counter", "Stacks bundles taken, by outcome and trigger.", ("target", "outcome", "trigger")
)
CAPTURED_BYTES = MetricDef("rayprof_captured_bytes", "counter", "Trace bytes the ranks captured.", ("target",))
STORED_BYTES = MetricDef(
    "rayprof_stored_bytes", "counter", "Bytes stored for profiles and stacks (every artifact listed).", ("target",)
)
WATCH_FIRINGS = MetricDef(
    "rayprof_watch_firings", "counter", "Watch firings, by condition and result.", ("target", "condition", "result")
)
WINDOW_DURATION = MetricDef(
    "rayprof_window_duration_seconds", "histogram", "From the first rank capturing to the last one done capturing.", ("target",)
)
POSTPROCESS_DURATION = MetricDef(
    "rayprof_postprocess_duration_seconds", "histogram", "Merging and analysing a profile's traces.", ("target",)
)
POST_WINDOW_RATIO = MetricDef(
    "rayprof_post_window_ratio", "gauge", "A rank's step time after the last window over before it.", ("target", "rank")
)
POST_WINDOW_CHECKS = MetricDef(
    "rayprof_post_window_checks", "counter", "Post-window checks ended, by verdict.", ("target", "verdict")
)

METRICS: tuple[MetricDef, ...] = (
    STEP_TIME,
    STEP_TIME_MEDIAN,
    STEPS_BEHIND,
    SINCE_STEP,
    STALLED,
    LAGGING,
    RANKS,
    PROFILES,
    STACKS,
    CAPTURED_BYTES,
    STORED_BYTES,
    WATCH_FIRINGS,
    WINDOW_DURATION,
    POSTPROCESS_DURATION,
    POST_WINDOW_RATIO,
    POST_WINDOW_CHECKS,
)


def exported(metric: MetricDef) -> list[str]:
    """The series names Ray's Prometheus endpoint gives ``metric``."""
    base = RAY_PREFIX + metric.name
    if metric.kind == "counter":
        return [base + "_total"]
    if metric.kind == "histogram":
        return [base + "_bucket", base + "_sum", base + "_count"]
    return [base]
