"""Group commit: callers that ask for a write while one is in flight share the next one.

Used for each profile's state file (:mod:`actors.controller.saved.persistence`) and the
index of finished profiles (:mod:`actors.controller.saved.catalog`): a thousand ranks
finishing at once, or a burst of finishes, cost a few writes. Each write takes
what is current when it starts, so it covers every ask made before it started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

__all__ = ["GroupCommit"]


@dataclass
class GroupCommit:
    """Writes asked for / writes done, as counters, for one thing written whole."""

    asked: int = 0
    done: int = 0

    @property
    def settled(self) -> bool:
        """Every write asked for is done."""
        return self.done >= self.asked

    async def write(self, hold: Callable[[], AbstractAsyncContextManager[Any]], write: Callable[[], Awaitable[None]]) -> None:
        """Ask for a write and wait until one that started after the ask has succeeded; ``hold``
        gives the lock that orders the writes, ``write`` writes what is current. A write that
        raises covers nobody: the error is the caller's, and the next waiter writes again."""
        self.asked += 1
        # Shielded: a caller cancelled mid-write (an agent's call dropped) must not release the
        # lock while its thread still writes, or that older snapshot could land after a newer one.
        await asyncio.shield(self._write(self.asked, hold, write))

    async def _write(
        self, wanted: int, hold: Callable[[], AbstractAsyncContextManager[Any]], write: Callable[[], Awaitable[None]]
    ) -> None:
        async with hold():
            if self.done >= wanted:
                return
            covered = self.asked
            await write()
            self.done = covered
