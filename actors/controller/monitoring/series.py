"""The controller's gauges and the recorder process that exports them, replaced to drop ended runs.

:class:`Series` keeps the value of every live gauge label set, sends what
changed to the recorder (:mod:`actors.controller.monitoring.recorder`) once per
monitor tick, and replaces the recorder with a fresh process once label sets
have ended: the fresh one gets every live value, the old one ends once the
fresh one answered (its copies of the live values set to 0 first), and Ray
stops exporting what only the old one held (on Ray 2.43 too, whose metrics
agent keeps a gauge's label sets for its process's life).

An ended label set keeps its final value (0 for the state gauges: an alert
clears) for at least the hold (``RAYPROF_METRICS_ENDED_KEPT_S``, 150 s), so a
scrape sees it; a replacement comes at most every :data:`REPLACE_EVERY` holds,
so runs that end often start a process every ten minutes, not one per run.
When nothing is live and nothing is held, the recorder is ended and none is
started: an idle controller runs none.

A recorder in the controller's own process (where Ray's agent forgets a gauge
not set for a while) is never replaced: an ended gauge, set no more, leaves by
itself; what is held of it is dropped after the hold.

Sends are one at a time: changes made while one is unanswered wait, merged,
for the next tick (what is held is bounded by the label sets, not by time). A
recorder that fails a send or leaves one unanswered for :data:`SEND_TIMEOUT_S`
is replaced with everything live, after a backoff that doubles with each
failure in a row (:data:`BACKOFF_S` to :data:`MAX_BACKOFF_S`): a recorder that
cannot start is not started again on every tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from actors.controller.monitoring.recorder import MetricUpdate, Recorder, SeriesKey

__all__ = ["BACKOFF_S", "MAX_BACKOFF_S", "REPLACE_EVERY", "SEND_TIMEOUT_S", "Series"]

logger = logging.getLogger(__name__)

# Replacements are at least this many holds apart: 10 min at the default hold.
REPLACE_EVERY = 4
SEND_TIMEOUT_S = 60.0
BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0


class Series:
    """Live gauge values, by (name, labels), and the recorder that exports them. Driven by the monitor tick's
    clock (``now`` in seconds); ``start`` makes a recorder (a Ray actor in the controller, a local one in
    tests); ``hold_s`` is how long an ended label set stays exported, as configured now."""

    def __init__(self, start: Callable[[], Recorder], hold_s: Callable[[], float]) -> None:
        self._start = start
        self._hold_s = hold_s
        self._live: dict[SeriesKey, float] = {}
        # Ended gauges the recorder still exports: their value, and when they ended.
        self._ended: dict[SeriesKey, tuple[float | None, float]] = {}
        # Not sent yet.
        self._pending = _Pending()
        self._recorder: Recorder | None = None
        self._started_at = 0.0
        self._sending: tuple[Future[None], float] | None = None
        # The recorder replaced: it still exports until the new one has answered (no live series has a gap).
        self._retiring: _Retiring | None = None
        self._failures = 0
        self._next_start = 0.0

    # ---- what the metrics record -------------------------------------------

    def gauge(self, key: SeriesKey, value: float) -> None:
        if self._live.get(key) == value:
            return  # the recorder sets it again on its refresh period
        self._live[key] = value
        self._pending.gauges[key] = value
        self._pending.ended.pop(key, None)
        self._ended.pop(key, None)

    def end(self, keys: Iterable[SeriesKey], finals: Mapping[str, float], now: float) -> None:
        """Gauges set no more: set once to their metric's final value (``finals``), or left at their last."""
        for key in keys:
            last = self._live.pop(key, None)
            self._pending.gauges.pop(key, None)
            final = finals.get(key[0])
            self._pending.ended[key] = final
            self._ended[key] = (last if final is None else final, now)

    def live(self) -> list[SeriesKey]:
        """The gauges being set."""
        return list(self._live)

    def shown(self) -> int:
        """Label sets the running recorder exports: the live ones and the ended ones it still holds."""
        return len(self._live) + len(self._ended)

    # ---- the tick ------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Once per tick: check the last send, retire a replaced recorder, replace it when due, send what changed."""
        if self._sending is not None and not self._answered(now):
            return
        self._retire(now)
        if self._recorder is None:
            if now >= self._next_start:
                self._replace(now)
        elif not self._recorder.own_process:
            # Ray forgets an ended gauge by itself: only what is held of it goes.
            self._ended = {k: (v, at) for k, (v, at) in self._ended.items() if now - at < self._hold_s()}
        elif self._replace_due(now):
            self._replace(now)
        if self._recorder is not None and self._sending is None and self._pending:
            update, self._pending = self._pending.update(), _Pending()
            self._sending = (self._recorder.send(update), now)

    def _answered(self, now: float) -> bool:
        """Whether the send in flight is done; a failed or overdue one ends the recorder."""
        assert self._sending is not None
        future, sent_at = self._sending
        if not future.done():
            if now - sent_at < SEND_TIMEOUT_S:
                return False
            why = f"no answer in {SEND_TIMEOUT_S:.0f} s"
        elif (error := future.exception()) is not None:
            why = f"{type(error).__name__}: {error}"
        else:
            self._sending = None
            self._failures = 0
            if self._retiring is not None and self._retiring.zeroed is None:
                # The new recorder shows the live gauges now: the old one's copies go to 0 before it ends.
                update = MetricUpdate(ended=[(name, labels, 0.0) for name, labels in self._retiring.gauges])
                self._retiring.zeroed = (self._retiring.recorder.send(update), now)
            return True
        self._sending = None
        if self._recorder is not None:
            self._recorder.close()
        self._recorder = None
        self._failed(now, f"the gauge recorder failed ({why})")
        return True

    def _failed(self, now: float, what: str) -> None:
        self._failures += 1
        wait_s = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (self._failures - 1))
        self._next_start = now + wait_s
        logger.warning("rayprof controller: %s; a new one in %.0f s", what, wait_s)

    def _retire(self, now: float) -> None:
        """End the replaced recorder once its copies of the live gauges are 0 (or it did not answer)."""
        retiring = self._retiring
        if retiring is None or retiring.zeroed is None:
            return
        future, sent_at = retiring.zeroed
        if future.done() or now - sent_at >= SEND_TIMEOUT_S:
            retiring.recorder.close()
            self._retiring = None

    def _replace_due(self, now: float) -> bool:
        hold_s = self._hold_s()
        if now - self._started_at < REPLACE_EVERY * hold_s:
            return False
        return any(now - at >= hold_s for _, at in self._ended.values())

    def _replace(self, now: float) -> None:
        """A fresh recorder with every live value and the ended ones still in their hold; the old one retires."""
        # What the old one shows at a live value: the live gauges, and those that ended since its last send.
        shown = [*self._live, *self._pending.ended]
        hold_s = self._hold_s()
        self._ended = {k: (v, at) for k, (v, at) in self._ended.items() if now - at < hold_s}
        old, self._recorder = self._recorder, None
        if self._retiring is not None and old is not None:
            self._retiring.recorder.close()  # replaced twice before an answer: the older one just ends
            self._retiring = None
        if not self.shown():
            # Nothing to show: no new process, and the old one ends at once.
            self._pending = _Pending()
            for ending in (old, self._retiring.recorder if self._retiring else None):
                if ending is not None:
                    ending.close()
            self._retiring = None
            return
        if old is not None:
            self._retiring = _Retiring(old, shown)
        try:
            self._recorder = self._start()
        except Exception as e:  # Ray refused to start an actor
            self._failed(now, f"cannot start the gauge recorder ({type(e).__name__}: {e})")
            return
        self._started_at = now
        self._pending = _Pending(gauges=dict(self._live), ended={k: v for k, (v, _) in self._ended.items()})


@dataclass
class _Pending:
    """Changes not sent yet, the latest per label set."""

    gauges: dict[SeriesKey, float] = field(default_factory=dict)
    ended: dict[SeriesKey, float | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.gauges or self.ended)

    def update(self) -> MetricUpdate:
        return MetricUpdate(
            gauges=[(name, labels, v) for (name, labels), v in self.gauges.items()],
            ended=[(name, labels, v) for (name, labels), v in self.ended.items()],
        )


@dataclass
class _Retiring:
    """A replaced recorder: it keeps exporting until the new one answered, then its live gauges go to 0."""

    recorder: Recorder
    gauges: list[SeriesKey]
    zeroed: tuple[Future[None], float] | None = None
