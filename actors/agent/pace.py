"""The rank's step time, read from the step counter on the poll thread: between heartbeats (what each heartbeat
carries) and just before a window (what the window's trace carries, :mod:`orchestrator.models.pace`).

Nothing here runs on the step path: the training thread only counts. A measure spans at least ``MIN_SPAN_S``
(polls can come milliseconds apart in a sync round, and a step time over so short a span is noise), and one that
began before the last window closed is not a measure of the job without a profiler.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MIN_SPAN_S", "Measure", "Pace"]

MIN_SPAN_S = 1.0


class Measure(NamedTuple):
    steps: int
    span_s: float
    began: float  # monotonic

    @property
    def step_s(self) -> float:
        return self.span_s / self.steps


class Pace:
    """Samples of (step count, monotonic time), taken by the poll thread."""

    def __init__(self) -> None:
        self._anchor: tuple[int, float] | None = None
        self._last: Measure | None = None
        self._closed_at = float("-inf")

    def sample(self, count: int, now: float) -> float | None:
        """A heartbeat's step time: the latest measure of at least ``MIN_SPAN_S`` (None before the first)."""
        if self._anchor is None:
            self._anchor = (count, now)
        elif (fresh := self._since_anchor(count, now)) is not None or now - self._anchor[1] >= MIN_SPAN_S:
            self._last = fresh or self._last
            self._anchor = (count, now)
        return self._last.step_s if self._last is not None else None

    def before_window(self, count: int, now: float) -> Measure | None:
        """The steps up to ``now`` since the last heartbeat where they span ``MIN_SPAN_S``, else the last measure;
        None where none is known, or the one known began before the last window closed."""
        measure = self._since_anchor(count, now) or self._last
        return measure if measure is not None and measure.began >= self._closed_at else None

    def window_closed(self, now: float) -> None:
        """A window closed at ``now``: the steps before it were profiled (any thread may call it)."""
        self._closed_at = now

    def _since_anchor(self, count: int, now: float) -> Measure | None:
        anchor = self._anchor
        if anchor is None or now - anchor[1] < MIN_SPAN_S or count <= anchor[0]:
            return None
        return Measure(count - anchor[0], now - anchor[1], anchor[1])
