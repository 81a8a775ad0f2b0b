"""The agent's stack sampler and thread clock in a recorder: ``prof.step()`` with both running over the recorded
steps.

A rayprof window samples the training thread's stack and times the thread from its first recorded step to its close,
and writes both into the trace before the profiler stops (:mod:`actors.agent.capture`); a recorder driving plain
torch.profiler with a schedule does the same here, before the ``prof.step()`` that saves the trace.
"""

from __future__ import annotations

import threading
from typing import Any

from actors.agent.frame_sampler import FrameSampler
from actors.agent.thread_clock import ThreadClock
from orchestrator.models.samples import FRAMES_METADATA_KEY
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY


class SampledSteps:
    """Stands in for ``prof`` where a loop calls ``prof.step()``: the sampler and the clock start as step call
    ``first`` begins the recorded steps and what they saw goes into the trace just before call ``last`` saves it."""

    def __init__(self, prof: Any, first: int, last: int, interval_s: float) -> None:
        self.prof = prof
        self.first, self.last = first, last
        self.sampler = FrameSampler(threading.get_ident(), interval_s, 20_000)
        self.clock: ThreadClock | None = None
        self.calls = 0

    def step(self) -> None:
        self.calls += 1
        if self.calls == self.first:
            self.sampler.start()
            self.clock = ThreadClock()
        if self.calls == self.last:
            samples = self.sampler.stop()
            assert samples is not None and self.clock is not None, "no stack sample in the recorded steps"
            self.prof.add_metadata_json(FRAMES_METADATA_KEY, samples.model_dump_json())
            self.prof.add_metadata_json(THREAD_TIME_METADATA_KEY, self.clock.stop().model_dump_json())
        self.prof.step()
