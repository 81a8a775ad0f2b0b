"""While a window records, time every cyclic garbage collection of the process through ``gc.callbacks``
(:class:`orchestrator.models.gc_pauses.GcPauses`), for the report to name the pauses no trace shows.

The callback is registered at the window's first boundary and removed at its close: outside a window a collection
pays nothing for it. In a window each collection pays two calls of it (~3 µs with the thread's CPU clock, against
a collection's tens of microseconds at the least); a collection long enough to record is kept with its time by the
clock and in CPU (a young collection of 0.1 ms of work reads 2-12 ms by the clock where its thread waits for a core
meanwhile), its generation, whether code called it (and from which line) and on which thread it ran.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from actors.agent.frame_sampler import frame_name, import_prefixes
from orchestrator.models.gc_pauses import GcCollection, GcPauses, GcTotal

__all__ = ["MIN_RECORDED_MS", "GcWatch"]

logger = logging.getLogger(__name__)

# Collections from this long on are kept one by one (a young generation's take tens to hundreds of microseconds and
# come by the thousand in a loop that builds Python objects; their totals are kept whatever their length).
MIN_RECORDED_MS = 0.5


class GcWatch:
    """Times the process's collections from :meth:`start` to :meth:`stop`, keeping at most ``max_records``."""

    def __init__(
        self, training_thread: int, max_records: int, clock_ns: Callable[[], int] = time.time_ns,
        cpu_clock_ns: Callable[[], int] = time.thread_time_ns,
    ) -> None:
        self.training_thread = training_thread
        self.max_records = max_records
        self._clock_ns = clock_ns
        self._cpu_clock_ns = cpu_clock_ns  # the calling thread's: a collection starts and ends on one thread
        self._prefixes = import_prefixes()
        self._records: list[GcCollection] = []
        self._totals = [[0, 0], [0, 0], [0, 0]]  # per generation: collections, ns
        self._truncated = False
        self._began = 0
        self._cpu_began = 0
        self._explicit = False
        self._caller: tuple[CodeType, int] | None = None
        self._thread = 0
        self._failed = False
        self._seen: tuple[bool, tuple[int, int, int], int] = (True, (0, 0, 0), 0)

    def start(self) -> None:
        self._seen = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())
        gc.callbacks.append(self._on_gc)

    def stop(self) -> GcPauses:
        """Stop timing and return what was seen."""
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass  # the job emptied gc.callbacks itself
        enabled, thresholds, frozen = self._seen
        # Built here from this watch's own records: nothing to validate (the training thread calls this at the close).
        return GcPauses.model_construct(
            enabled=enabled, thresholds=thresholds, frozen=frozen, min_recorded_ms=MIN_RECORDED_MS,
            collections=self._records, truncated=self._truncated,
            totals=[GcTotal.model_construct(generation=g, count=n, ms=ns / 1e6) for g, (n, ns) in enumerate(self._totals) if n],
        )

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the collector on whichever thread allocated: it must never raise (the interpreter would print
        # the error in the middle of the job's output), and a watch that fails stops recording.
        if self._failed:
            return
        try:
            now, cpu = self._clock_ns(), self._cpu_clock_ns()
            if phase == "start":
                self._began, self._cpu_began, self._thread = now, cpu, threading.get_ident()
                threshold = gc.get_threshold()[0]
                # The collector starts its own once the young generation's count passes its threshold; a call of
                # gc.collect() finds it at or under it (or finds automatic collection off).
                self._explicit = not gc.isenabled() or threshold == 0 or gc.get_count()[0] <= threshold
                self._caller = _caller() if self._explicit else None
                return
            ns = now - self._began
            generation = min(max(int(info.get("generation", 0)), 0), 2)
            self._totals[generation][0] += 1
            self._totals[generation][1] += ns
            if ns < MIN_RECORDED_MS * 1e6:
                return
            if len(self._records) >= self.max_records:
                self._truncated = True
                return
            caller = frame_name(*self._caller, self._prefixes) if self._caller is not None else None
            self._records.append(GcCollection.model_construct(
                start_us=self._began // 1000, ms=ns / 1e6, cpu_ms=min(max(0, cpu - self._cpu_began), ns) / 1e6,  # no faster than time
                generation=generation, explicit=self._explicit,
                caller=caller, training_thread=self._thread == self.training_thread,
            ))
        except Exception:
            self._failed = True
            logger.exception("rayprof: timing a garbage collection failed; this window records no more of them")


def _caller() -> tuple[CodeType, int] | None:
    """The Python frame that called gc.collect(): frame 0 is this function, 1 the callback, 2 the caller (none
    where C code with no Python frame above it collected)."""
    try:
        frame = sys._getframe(2)
    except ValueError:
        return None
    return frame.f_code, frame.f_lineno
