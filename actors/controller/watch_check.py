"""A watch is checked once, when it is created, against the server's limits: one that could never act
as asked is refused then (HTTP 422), not on every firing."""

from __future__ import annotations

from orchestrator.errors import InvalidWatchError
from orchestrator.models.control import ControllerConfig
from orchestrator.models.diagnosis import WatchSpec

__all__ = ["MIN_BASELINE_SAMPLES", "check"]

# Samples a baseline needs before it is trusted.
MIN_BASELINE_SAMPLES = 5


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
    if spec.slower_than is not None and spec.baseline_s < MIN_BASELINE_SAMPLES * config.monitor_interval_s:
        raise InvalidWatchError(
            f"baseline_s={spec.baseline_s:g} holds fewer than {MIN_BASELINE_SAMPLES} samples at one per "
            f"{config.monitor_interval_s:g}s (RAYPROF_MONITOR_INTERVAL_S): the baseline would never be ready",
            target=spec.target,
        )
