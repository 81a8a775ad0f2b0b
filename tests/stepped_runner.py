"""A controller whose runner is stepped by the test (``Runner.step``), not run by itself."""

from __future__ import annotations

import asyncio

from actors.controller.actor import Controller
from actors.controller.state import Profile


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
