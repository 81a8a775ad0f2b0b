"""The rank's step time, read from the step counter on the poll thread: between heartbeats (what each heartbeat
carries) and just before a window (what the window's trace carries, :mod:`orchestrator.models.pace`).

Nothing here runs on the step path: the training thread only counts. A measure spans at least ``MIN_SPAN_S``
(polls can come milliseconds apart in a sync round, and a step time over so short a span is noise). The steps
before a window are measured from the earliest sample of the last ``LOOKBACK_S`` taken after the last window closed
(the close itself is one): the longest recent span of the job without a profiler, whenever the window is armed.
Windows back to back (armed within a second of the last close) get the measure the last window got: the job's pace
before the run of windows. Heartbeat samples are kept a second apart, so a sync round's burst of polls as a window is
scheduled does not push out the ones a measure needs.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

__all__ = ["LOOKBACK_S", "MIN_SPAN_S", "Measure", "Pace"]

MIN_SPAN_S = 1.0
LOOKBACK_S = 60.0
# Samples are kept at least MIN_SPAN_S apart: this many reach past LOOKBACK_S.
_SAMPLES = 64


class Measure(NamedTuple):
    steps: int
    span_s: float
    began: float  # monotonic
    windows_before: int = 0  # windows this process closed before: its first pays the profiler's first use

    @property
    def step_s(self) -> float:
        return self.span_s / self.steps


class Pace:
    """Samples of (step count, monotonic time): the poll thread's at each heartbeat, the closing thread's at a close."""

    def __init__(self) -> None:
        self._anchor: tuple[int, float] | None = None
        self._last: float | None = None
        self._samples: deque[tuple[int, float]] = deque(maxlen=_SAMPLES)
        self._closed: tuple[int, float] | None = None  # replaced whole: the training thread sets it
        self._windows = 0
        self._given: Measure | None = None  # the last measure a window got

    def sample(self, count: int, now: float) -> float | None:
        """A heartbeat's step time: the latest over at least ``MIN_SPAN_S`` (None before the first)."""
        if not self._samples or now - self._samples[-1][1] >= MIN_SPAN_S:
            # Kept a second apart: a sync round's burst of polls (as a window is scheduled) must not push out the
            # samples a measure needs.
            self._samples.append((count, now))
        anchor = self._anchor
        if anchor is None:
            self._anchor = (count, now)
        elif now - anchor[1] >= MIN_SPAN_S:
            if count > anchor[0]:
                self._last = (now - anchor[1]) / (count - anchor[0])
            self._anchor = (count, now)
        return self._last

    def before_window(self, count: int, now: float) -> Measure | None:
        """The steps from the earliest usable sample up to ``now``; where none is (no sample of the last
        ``LOOKBACK_S`` since the last window closed is ``MIN_SPAN_S`` old with steps after it: windows back to back),
        the measure the last window got, if it ended within ``LOOKBACK_S``; else None."""
        closed = self._closed
        since = closed[1] if closed is not None else float("-inf")
        usable = [
            (c, t) for c, t in (*self._samples, *([closed] if closed else []))
            if t >= since and MIN_SPAN_S <= now - t <= LOOKBACK_S and c < count
        ]
        if usable:
            c, t = min(usable, key=lambda s: s[1])
            self._given = Measure(count - c, now - t, t, self._windows)
            return self._given
        given = self._given
        if given is None or now - (given.began + given.span_s) > LOOKBACK_S:
            return None
        return given._replace(windows_before=self._windows)

    def window_closed(self, count: int, now: float) -> None:
        """A window closed at step ``count``: the steps before it were profiled."""
        self._closed = (count, now)
        self._windows += 1
