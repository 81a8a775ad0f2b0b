"""Which targets and runs have been gone long enough for what is kept about them to be dropped.

The controller is detached: it outlives hundreds of training runs, each with a
unique name (``ray_train_run-<date>`` in Train v2, ``TorchTrainer_<date>`` in
v1). Whatever it keeps per target or run (a watch's step-time series, a stall's
stacks, a window's arm round, metrics) is dropped once no worker of it has been
live for ``ended_run_kept_s``: a run that comes back within that (a worker group
restart, a controller restart) keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["EndedRuns", "Gone"]

RunKey = tuple[str, str]


@dataclass(frozen=True)
class Gone:
    """What one check found gone for the grace period: target names, and (target, run) pairs."""

    targets: list[str] = field(default_factory=list)
    runs: list[RunKey] = field(default_factory=list)


class EndedRuns:
    """When each target and each run was last seen live (by the caller's monotonic clock)."""

    def __init__(self) -> None:
        self._targets: dict[str, float] = {}
        self._runs: dict[RunKey, float] = {}

    def check(self, live: Iterable[RunKey], now: float, kept_s: float) -> Gone:
        """Note the runs live at ``now``; returns (and stops tracking) those gone for over ``kept_s``."""
        for key in live:
            self._runs[key] = now
            self._targets[key[0]] = now
        gone = Gone(
            targets=[t for t, at in self._targets.items() if now - at > kept_s],
            runs=[r for r, at in self._runs.items() if now - at > kept_s],
        )
        for t in gone.targets:
            del self._targets[t]
        for r in gone.runs:
            del self._runs[r]
        return gone
