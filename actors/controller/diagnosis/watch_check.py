"""A watch is checked once, when it is created, against the server's limits: one that could never act
as asked is refused then (HTTP 422), not on every firing."""

from __future__ import annotations

import math

from orchestrator.errors import InvalidWatchError
from orchestrator.models.control import ControllerConfig
from orchestrator.models.diagnosis import WatchSpec

__all__ = ["MIN_BASELINE_SAMPLES", "MIN_EVERY_S", "check"]

# Samples a baseline needs before it is trusted.
MIN_BASELINE_SAMPLES = 5
# The shortest schedule: once a minute is the most the hourly cap (max_per_hour <= 60) allows, and a
# window, its upload and its postprocess take seconds to tens of seconds.
MIN_EVERY_S = 60.0
_HOUR_S = 3600.0


def check(spec: WatchSpec, config: ControllerConfig) -> None:
    """Refuse a watch whose action the server would refuse, or that could never fire."""
    if spec.action == "profile":
        if spec.stalled:
            raise InvalidWatchError(
                "a stalled run takes no steps, so a profile window would never start: use action='stacks'",
                target=spec.target,
            )
        if spec.profile_steps > config.max_steps:
            raise InvalidWatchError(
                f"profile_steps={spec.profile_steps} is over the maximum of {config.max_steps} (RAYPROF_MAX_STEPS)",
                target=spec.target,
            )
    elif spec.ranks == "lagging":
        raise InvalidWatchError("ranks='lagging' picks the ranks to profile; it needs action='profile'", target=spec.target)
    if spec.every_s is not None:
        _check_schedule(spec)
    if spec.slower_than is not None and spec.baseline_s < MIN_BASELINE_SAMPLES * config.monitor_interval_s:
        raise InvalidWatchError(
            f"baseline_s={spec.baseline_s:g} holds fewer than {MIN_BASELINE_SAMPLES} samples at one per "
            f"{config.monitor_interval_s:g}s (RAYPROF_MONITOR_INTERVAL_S): the baseline would never be ready",
            target=spec.target,
        )


def _check_schedule(spec: WatchSpec) -> None:
    """A schedule the cooldown or the hourly cap would hold back is refused (it would fire in bursts),
    as are a condition's options; every problem is named at once."""
    every = spec.every_s or 0.0
    problems = []
    if every < MIN_EVERY_S:
        problems.append(f"every_s={every:g} is under the minimum of {MIN_EVERY_S:g}s")
    if spec.cooldown_s > every:
        problems.append(
            f"cooldown_s={spec.cooldown_s:g} is longer than every_s={every:g}: it would hold back scheduled "
            "firings; give a cooldown of at most every_s"
        )
    if every * spec.max_per_hour < _HOUR_S:
        per_hour = _HOUR_S / every
        # A period of a few ulps (5e-324 s, as a fuzzer sends) fires an infinity of times an hour: no count to raise to.
        raise_to = f"raise max_per_hour to {math.ceil(per_hour)} or " if math.isfinite(per_hour) else ""
        problems.append(
            f"every_s={every:g} fires {per_hour:.3g} times an hour, over max_per_hour={spec.max_per_hour}: "
            f"{raise_to}lengthen every_s"
        )
    for name, what in (("for_s", "how long a condition holds"), ("baseline_s", "slower_than's baseline")):
        if getattr(spec, name) != WatchSpec.model_fields[name].default:
            problems.append(f"{name} is {what}; a schedule has no condition: leave it out")
    if problems:
        raise InvalidWatchError("; ".join(problems), target=spec.target)
