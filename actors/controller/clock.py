"""The controller's clock, injected so that tests step time instead of sleeping fixed spans.

``monotonic`` times what only this process compares: heartbeats, stalls, a watch's hold, a
profile's timeout and its arm round, retention's retries, how long another holder's name lease
stood still (registry, watches, runner, retention, name lease). ``wall`` dates what is saved and
compared after a restart or by another cluster: firings, cooldowns, hourly caps, schedules, the
step history and post-window checks, retention ages, gc's grace, owner leases, a profile's and a stacks
bundle's dates and ids, submit keys' day. Real time stays where the controller waits on agents, not
on itself: a stacks bundle's wait for answers and the wait for agents after a restart (a stepped clock
nobody moves must not hold them open). The controller's
background loops read :data:`SYSTEM_CLOCK`; a test gives ``Controller(clock=...)`` a clock it
moves itself (``tests/support/stepped_runner.ManualClock``) and steps ``Watches.tick`` and
``Runner.step`` on it.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Protocol

from orchestrator.models.common import utcnow

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> datetime: ...


class SystemClock:
    """The process's own clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return utcnow()


SYSTEM_CLOCK: Clock = SystemClock()
