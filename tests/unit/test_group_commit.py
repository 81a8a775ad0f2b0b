"""The group commit that state files and the index share: asks during a write share the next one,
and a write that fails covers nobody."""

from __future__ import annotations

import asyncio

import pytest

from actors.controller.saved.group_commit import GroupCommit


def test_asks_during_a_write_share_the_next_one():
    async def go() -> tuple[int, bool]:
        commit, lock, started, release = GroupCommit(), asyncio.Lock(), asyncio.Event(), asyncio.Event()
        writes = 0

        async def write() -> None:
            nonlocal writes
            writes += 1
            started.set()
            await release.wait()

        first = asyncio.ensure_future(commit.write(lambda: lock, write))
        await started.wait()
        rest = [asyncio.ensure_future(commit.write(lambda: lock, write)) for _ in range(10)]
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, *rest)
        return writes, commit.settled

    writes, settled = asyncio.run(go())
    assert writes == 2 and settled


def test_a_failed_write_covers_nobody_and_the_next_ask_writes_again():
    async def go() -> tuple[int, bool, bool]:
        commit, lock = GroupCommit(), asyncio.Lock()
        tries = 0

        async def write() -> None:
            nonlocal tries
            tries += 1
            if tries == 1:
                raise OSError("down")

        with pytest.raises(OSError):
            await commit.write(lambda: lock, write)
        unsettled = not commit.settled
        await commit.write(lambda: lock, write)
        return tries, unsettled, commit.settled

    assert asyncio.run(go()) == (2, True, True)
