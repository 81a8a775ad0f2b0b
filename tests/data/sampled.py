"""The agent's stack sampler, thread clock and garbage-collection watch in a recorder: ``prof.step()`` with all three
running over the recorded steps.

A rayprof window samples the training thread's stack and times the thread and the collector from its first recorded
step to its close, and writes what they saw into the trace before the profiler stops (:mod:`actors.agent.capture`); a recorder driving plain
torch.profiler with a schedule does the same here, before the ``prof.step()`` that saves the trace.
"""

from __future__ import annotations

import threading
from typing import Any

from actors.agent.frame_sampler import FrameSampler
from actors.agent.gc_watch import GcWatch
from actors.agent.thread_clock import ThreadClock
from orchestrator.models.gc_pauses import GC_METADATA_KEY
from orchestrator.models.samples import FRAMES_METADATA_KEY
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY
from orchestrator.settings import GC_RECORDS_MAX


class SampledSteps:
    """Stands in for ``prof`` where a loop calls ``prof.step()``: the sampler, the clock and the watch start as step call
    ``first`` begins the recorded steps and what they saw goes into the trace just before call ``last`` saves it."""

    def __init__(self, prof: Any, first: int, last: int, interval_s: float) -> None:
        self.prof = prof
        self.first, self.last = first, last
        self.sampler = FrameSampler(threading.get_ident(), interval_s, 20_000)
        self.clock: ThreadClock | None = None
        self.gc = GcWatch(threading.get_ident(), GC_RECORDS_MAX)
        self.calls = 0

    def step(self) -> None:
        self.calls += 1
        if self.calls == self.first:
            self.sampler.start()
            self.clock = ThreadClock()
            self.gc.start()
        if self.calls == self.last:
            samples = self.sampler.stop()
            assert samples is not None and self.clock is not None, "no stack sample in the recorded steps"
            self.prof.add_metadata_json(FRAMES_METADATA_KEY, samples.model_dump_json())
            self.prof.add_metadata_json(THREAD_TIME_METADATA_KEY, self.clock.stop().model_dump_json())
            self.prof.add_metadata_json(GC_METADATA_KEY, self.gc.stop().model_dump_json())
        self.prof.step()
