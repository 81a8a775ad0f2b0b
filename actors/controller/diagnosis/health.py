"""Stall and lag of a run, from the heartbeats the registry already holds (pure functions).

Every agent heartbeats with each long-poll from its own thread, so a rank
blocked in a collective still reports: its step count simply stops going up.
A run is STALLED when no rank advanced for ``max(stall_min_s, factor x its
median step time)``, never less than two heartbeats (progress is only seen
once per heartbeat), while some rank still heartbeats: a run none of whose
ranks was heard from for two heartbeats has ended or been cut off (Ray Train
kills a finished run's workers), which the reaper tells once their expiry
passes; stacks of it would be of workers that are gone. Steps behind are read
at one common instant, the oldest of the ranks' latest heartbeats, by
interpolating each rank's recent heartbeats, never by extrapolating: a rank whose heartbeat is a few seconds
older is not taken for one that lags. Nor is one a few steps of a fast job behind:
heartbeats are dated on arrival, so a lag must also come to ``lag_min_s`` at the median step.

Nothing here reads a clock: ``now`` and the heartbeats' times come from the
caller's (:mod:`actors.controller.clock`), so a test steps them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.settings import LAG_MIN_S

__all__ = ["Health", "Progress", "assess", "step_at"]


class _Info(Protocol):
    world_rank: int


class Progress(Protocol):
    """What health needs of a worker (``registry.Worker`` has it)."""

    info: _Info
    step: int
    step_time_s: float | None
    advanced_at: float
    heard_at: float
    samples: Sequence[tuple[float, int]]


@dataclass(frozen=True)
class Health:
    """One run's health at one instant."""

    stalled: bool
    stalled_s: float
    threshold_s: float
    median_step_s: float | None
    behind: dict[int, int] = field(default_factory=dict)
    lagging: list[int] = field(default_factory=list)

    @property
    def most_behind(self) -> int:
        return max(self.behind.values(), default=0)


def step_at(samples: Sequence[tuple[float, int]], t: float) -> float:
    """A rank's step at time ``t``, interpolated between its heartbeats; clamped at both ends. Of
    heartbeats dated alike (a clock stepped by a test stands still between steps), the newest counts."""
    if not samples:
        return 0.0
    later = samples[-1]
    if t >= later[0]:
        return float(later[1])
    for earlier in reversed(samples):
        if earlier[0] <= t:  # earlier <= t < later: the two heartbeats around t
            return earlier[1] + (later[1] - earlier[1]) * (t - earlier[0]) / (later[0] - earlier[0])
        later = earlier
    return float(samples[0][1])


def assess(
    workers: Iterable[Progress],
    now: float,
    *,
    stall_min_s: float,
    step_factor: float,
    lag_steps: int,
    heartbeat_s: float,
    lag_min_s: float = LAG_MIN_S,
) -> Health:
    """Stalled or not, and each rank's steps behind the leader; lagging: at least ``lag_steps`` and ``lag_min_s``
    of the median step behind."""
    ranks = list(workers)
    times = [w.step_time_s for w in ranks if w.step_time_s]
    median = statistics.median(times) if times else None
    threshold = max(stall_min_s, step_factor * (median or 0.0), 2 * heartbeat_s)
    stalled_s = now - max((w.advanced_at for w in ranks), default=now)
    heard = any(now - w.heard_at <= 2 * heartbeat_s for w in ranks)
    sampled = [w for w in ranks if w.samples]
    behind: dict[int, int] = {}
    if sampled:
        instant = min(w.samples[-1][0] for w in sampled)
        steps = {w.info.world_rank: step_at(w.samples, instant) for w in sampled}
        lead = max(steps.values())
        behind = {rank: int(round(lead - s)) for rank, s in steps.items()}
    return Health(
        stalled=heard and stalled_s >= threshold,
        stalled_s=stalled_s,
        threshold_s=threshold,
        median_step_s=median,
        behind=behind,
        lagging=sorted(r for r, b in behind.items() if b >= lag_steps and (median is None or b * median >= lag_min_s)),
    )
