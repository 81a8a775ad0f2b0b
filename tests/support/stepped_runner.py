"""Time driven by the test: a clock it moves, and a controller whose runner and monitor it steps.

The controller reads every clock it compares through one :class:`actors.controller.clock.Clock`; a
test hands it a :class:`ManualClock` and moves that instead of sleeping, so a hold, a stall, a
cooldown or a schedule is as long as the test says, however loaded the machine is.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from actors.controller.actor import Controller
from actors.controller.profiles.state import Profile
from orchestrator.models.common import utcnow
from orchestrator.models.profile import ProfileStatus
from tests.support.fake_agents import FakeAgent, start_agents


class ManualClock:
    """A :class:`actors.controller.clock.Clock` that stands still until the test moves it, each of its two
    clocks on its own. It starts at the process's clocks, so what still reads them (the agents' reports,
    a stacks bundle's wait for answers) stays comparable."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self.at = utcnow()

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        """The monotonic clock moves on (heartbeats, holds, stalls, timeouts); the wall clock stays."""
        self.now += seconds

    def forward(self, seconds: float) -> None:
        """The wall clock moves on (firings, cooldowns, caps, schedules): an hour of schedule without
        an hour of heartbeats."""
        self.at += timedelta(seconds=seconds)


class Stepped:
    """Takes the runner's loop away from a controller: its profiles move only when the test
    calls :meth:`step` (``Runner.step``, one iteration of the loop), until :meth:`release`
    hands a profile back to the runner's own loop. The test waits on nothing but its agents."""

    def __init__(self, c: Controller) -> None:
        self._c = c
        self._runner_loop = c._runner.run
        self._released: dict[str, asyncio.Event] = {}
        c._runner.run = self._hold

    async def _hold(self, profile: Profile) -> None:
        await self._release_of(profile.id).wait()
        await self._runner_loop(profile)

    def _release_of(self, profile_id: str) -> asyncio.Event:
        return self._released.setdefault(profile_id, asyncio.Event())

    async def step(self, profile_id: str) -> bool:
        """One iteration of the runner's loop for this profile; True once it is terminal."""
        return await self._c._runner.step(self._c._catalog.live[profile_id])

    def release(self, profile_id: str) -> None:
        self._release_of(profile_id).set()


async def _idle() -> None:
    await asyncio.Event().wait()


class SteppedMonitor:
    """Takes the monitor loop (health, watches, telemetry) and the worker reaper away from a controller
    made with ``clock``, and makes its fake agents train on that clock: each :meth:`tick` moves the
    monotonic clock (the wall clock moves only by ``clock.forward``, unless ``wall``: then each tick moves it
    as far, for what dates heartbeats, the step history), lets every agent train for that long and heartbeat
    (as its long-poll would), then runs one monitor tick. The runner's timeouts read the same clock, so
    nothing times out unless the test ticks that far; replies and reports still flow on real time. Make it
    before the controller starts."""

    def __init__(self, c: Controller, clock: ManualClock, *, wall: bool = False) -> None:
        self.c = c
        self.clock = clock
        self.wall = wall
        self.agents: list[FakeAgent] = []
        c._monitor = _idle  # type: ignore[method-assign]
        c._reap_workers = _idle  # type: ignore[method-assign]

    async def start_agents(self, world_size: int, **kwargs: object) -> list[FakeAgent]:
        """Fake agents of one run that train on this clock."""
        agents = await start_agents(self.c, world_size, stepped=True, **kwargs)
        self.agents.extend(agents)
        return agents

    async def tick(self, seconds: float | None = None) -> None:
        """Move the clock by ``seconds`` (one monitor interval unless given), train and heartbeat every
        agent, run one monitor tick, and let the tasks it started (a firing, a save) run as far as they
        go without waiting."""
        seconds = self.c._settings().monitor_interval_s if seconds is None else seconds
        self.clock.advance(seconds)
        if self.wall:
            self.clock.forward(seconds)
        for agent in self.agents:
            if not agent.stopped:
                agent.advance(seconds)
                self.c._registry.heartbeat(agent.info.agent_id, agent.step, agent.step_s)
        self.c._monitor_step(self.clock.monotonic())
        await settle()

    async def ticks(self, count: int, seconds: float | None = None) -> None:
        for _ in range(count):
            await self.tick(seconds)

    async def tick_until(self, holds: Callable[[], Any], *, max_ticks: int, real_s: float = 20.0) -> Any:
        """Tick until ``holds()`` (a value, or an awaitable of one) is true, at most ``max_ticks`` times and
        ``real_s`` seconds of real time (a firing's stacks or window wait on the agents' replies, on real
        time, between ticks); returns its last value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + real_s
        for _ in range(max_ticks):
            if value := await _value(holds()):
                return value
            if loop.time() >= deadline:
                break
            await self.tick()
            await asyncio.sleep(0.01)
        return await _value(holds())

    async def until_terminal(self, profile_id: str, *, max_ticks: int = 400) -> ProfileStatus:
        """Tick until the profile ends (its window's steps are trained on this clock); its status."""
        done = await self.tick_until(lambda: profile_id not in self.c._catalog.live, max_ticks=max_ticks)
        status = await self.c.get(profile_id)
        assert done, f"{profile_id} did not end within {max_ticks} ticks: {status.state}"
        return status


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def settle(rounds: int = 20) -> None:
    """Let ready tasks run: a few turns of the event loop, no time passing on any clock."""
    for _ in range(rounds):
        await asyncio.sleep(0)
