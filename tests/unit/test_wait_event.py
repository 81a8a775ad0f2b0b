"""actors.controller.profiles.state.wait_event: every long-poll waits in it, on Python 3.10 and later."""

from __future__ import annotations

import asyncio

import pytest

from actors.controller.profiles.state import wait_event


def _tasks_left() -> set[asyncio.Task]:
    return asyncio.all_tasks() - {asyncio.current_task()}


def test_returns_when_the_event_is_set_and_when_the_time_is_up():
    async def main() -> None:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, event.set)
        await wait_event(event, 30)
        assert event.is_set()
        await wait_event(asyncio.Event(), 0.01)
        await asyncio.sleep(0)
        assert _tasks_left() == set()

    asyncio.run(main())


def test_a_cancelled_wait_is_cancelled_and_leaves_no_task_behind():
    async def main() -> None:
        event = asyncio.Event()
        waiting = asyncio.ensure_future(wait_event(event, 30))
        for _ in range(5):  # a few turns of the loop: the wait and its waiter have started, no time passed
            await asyncio.sleep(0)
        waiting.cancel()
        # The event set in the same loop turn as the cancellation: the cancellation still wins.
        event.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)
        assert _tasks_left() == set()

    asyncio.run(main())
