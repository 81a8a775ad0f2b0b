"""One watch as the controller holds it: its spec, its firings, what it saw last, and its save state."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestrator.models.diagnosis import WatchFiring, WatchSpec, WatchStatus

__all__ = ["FIRINGS_KEPT", "WatchRecord"]

# Firings shown in a watch's status (and saved): the cap and cooldown read ``fired``, not these.
FIRINGS_KEPT = 20


@dataclass
class WatchRecord:
    id: str
    spec: WatchSpec
    created_at: datetime
    firings: list[WatchFiring] = field(default_factory=list)
    # When it fired or tried to, newest last: the cooldown and the rolling-hour cap read these, and
    # no more than max_per_hour are ever needed to tell whether the cap is reached.
    fired: deque[datetime] = field(default_factory=deque)
    failures: int = 0
    paused: str | None = None
    state: str = "WAITING"
    baseline: float | None = None
    observed: float | None = None
    note: str | None = None
    holding_since: float | None = None
    busy: bool = False
    # Changes to save (a firing, a pause) / the last of them saved: a save that lands after a
    # newer one failed must not mark the watch saved.
    changes: int = 0
    saved: int = 0
    save_tried: float = 0.0

    def __post_init__(self) -> None:
        self.fired = deque(self.fired, maxlen=self.spec.max_per_hour)

    def next_at(self) -> datetime | None:
        """A schedule's next firing: due at creation, then every_s after the last firing or failed try."""
        if self.spec.every_s is None:
            return None
        return self.fired[-1] + timedelta(seconds=self.spec.every_s) if self.fired else self.created_at

    def status(self, now: float) -> WatchStatus:
        return WatchStatus(
            id=self.id,
            spec=self.spec,
            created_at=self.created_at,
            state="PAUSED" if self.paused is not None else self.state,
            baseline=self.baseline,
            observed=self.observed,
            holding_s=now - self.holding_since if self.holding_since is not None else None,
            next_at=self.next_at(),
            note=self.note,
            firings=self.firings[-FIRINGS_KEPT:],
            fired_at=list(self.fired),
            failures=self.failures,
            paused=self.paused,
        )
