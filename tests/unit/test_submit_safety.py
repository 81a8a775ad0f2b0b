"""Submits and deletes under concurrency and retries: limits hold when many submits arrive at once,
a retried submit with its Idempotency-Key gets the first profile, and a delete is never undone by a
save that was in flight. The real ``Controller`` class with fake agents, without Ray."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta

import pytest

from actors.controller.profiles import idempotency
from actors.controller.profiles.idempotency import SubmitKey, SubmitKeys
from orchestrator.errors import ConflictError, IdempotencyKeyReusedError
from orchestrator.layout import state_key, watch_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.profile import ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.storage import open_storage
from tests.support.fake_agents import MONITORED, make_controller, run, start_agents, until, wait_terminal

QUEUE_MAX = 2


def request(steps: int = 30, **options) -> ProfileRequest:
    return ProfileRequest(target="run", steps=steps, **options)


def controller(home: StorageSpec, **overrides):
    return make_controller(home, max_queued_per_target=QUEUE_MAX, **overrides)


# ---- item 9: limits are checked and reserved in one step ---------------------------


def test_twenty_concurrent_submits_to_one_target_start_one_window_and_queue_at_most_the_limit(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        alone = await asyncio.gather(*(c.submit(request()) for _ in range(20)), return_exceptions=True)
        queued = await asyncio.gather(*(c.submit(request(queue=True)) for _ in range(20)), return_exceptions=True)
        total = (await c.list()).total
        for profile in (await c.list()).profiles:
            await c.cancel(profile.id)
        for a in agents:
            await a.stop()
        return alone, queued, total

    alone, queued, total = run(go())
    assert sum(isinstance(r, ProfileStatus) for r in alone) == 1
    assert all(isinstance(r, ConflictError) and "already running" in r.message for r in alone if not isinstance(r, ProfileStatus))
    assert sum(isinstance(r, ProfileStatus) for r in queued) == QUEUE_MAX
    refused = [r for r in queued if not isinstance(r, ProfileStatus)]
    assert all(isinstance(r, ConflictError) and f"(max {QUEUE_MAX})" in r.message for r in refused)
    assert total == 1 + QUEUE_MAX


# ---- item 11: a retried submit gets the first profile -------------------------------


def test_a_retried_submit_with_its_key_gets_the_first_profile_even_after_a_restart(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        # The client's first try and its retries (it timed out), some of them at once.
        tries = await asyncio.gather(*(c.submit(request(steps=3), "retry-me") for _ in range(5)))
        first = tries[0]
        done, _ = await wait_terminal(c, first.id)
        again = await c.submit(request(steps=3), "retry-me")
        for task in list(c._tasks):  # the actor restarts
            task.cancel()
        restarted = controller(home)
        for a in agents:
            a.controller = restarted
        after_restart = await restarted.submit(request(steps=3), "retry-me")
        with pytest.raises(IdempotencyKeyReusedError) as reused:
            await restarted.submit(request(steps=4), "retry-me")
        other = await restarted.submit(request(steps=3), "another-key")
        await wait_terminal(restarted, other.id)
        total = (await restarted.list()).total
        for a in agents:
            await a.stop()
        return first, tries, done, again, after_restart, reused.value, other, total

    first, tries, done, again, after_restart, reused, other, total = run(go())
    assert {t.id for t in tries} == {first.id}
    assert done.state == ProfileState.DONE
    assert again.id == after_restart.id == first.id and after_restart.state == ProfileState.DONE
    assert reused.http_status == 422 and "already used for another request" in reused.message and first.id in reused.message
    assert other.id != first.id
    assert total == 2


def test_submit_keys_are_kept_a_day_and_at_most_the_newest_few(monkeypatch):
    monkeypatch.setattr(idempotency, "_KEPT", 3)
    keys = SubmitKeys()
    asked = request(steps=3)
    now = utcnow()
    # Restored from saved state: only keys younger than a day come back.
    keys.restore([(SubmitKey.of("yesterday", asked), "p-old", now - timedelta(hours=25)), (None, "p-keyless", now)])
    keys.remember(SubmitKey.of("a-day-ago", asked), "p-day", now - idempotency.KEY_TTL - timedelta(seconds=1))
    keys.remember(SubmitKey.of("k0", asked), "p0", now)

    def found(key: str) -> str | None:
        return keys.find(SubmitKey.of(key, asked), lambda _: True)

    assert found("yesterday") is None and found("a-day-ago") is None and found("k0") == "p0"
    for i in range(1, 4):
        keys.remember(SubmitKey.of(f"k{i}", asked), f"p{i}", now)
    assert [found(f"k{i}") for i in range(4)] == [None, "p1", "p2", "p3"]


def test_a_key_whose_profile_was_deleted_makes_a_new_one(home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        first = await c.submit(request(steps=3), "k1")
        await wait_terminal(c, first.id)
        await c.delete(first.id)
        second = await c.submit(request(steps=3), "k1")
        await wait_terminal(c, second.id)
        for a in agents:
            await a.stop()
        return first, second

    first, second = run(go())
    assert second.id != first.id


# ---- item 10: a delete is ordered after the saves in flight -------------------------


class HeldWrites:
    """Holds the write of one key in storage (in its thread) until released: a save in flight."""

    def __init__(self, home: StorageSpec, monkeypatch: pytest.MonkeyPatch, holds) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.written = threading.Event()
        storage = open_storage(home)
        put = storage.put_state  # saved state is written through it

        def put_state(data: bytes, key: str, *args, **kwargs):
            if self.entered.is_set() or not holds(key, data):
                return put(data, key, *args, **kwargs)
            self.entered.set()
            self.release.wait(10)
            try:
                return put(data, key, *args, **kwargs)
            finally:
                self.written.set()

        monkeypatch.setattr(storage, "put_state", put_state)


def queued_behind_the_save(c, key: str) -> bool:
    """Whether a delete waits on ``key`` behind the save that holds it (two users of its lock)."""
    held = c._persistence._keys._locks.get(key)
    return held is not None and held.users >= 2


def test_a_profile_deleted_while_its_last_save_is_in_flight_stays_deleted_after_a_restart(home, monkeypatch):
    def final_save(key: str, data: bytes) -> bool:
        return "/profiles/" in key and json.loads(data)["state"] == "DONE"

    held = HeldWrites(home, monkeypatch, final_save)

    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        submitted = await c.submit(request(steps=3))
        assert await until(held.entered.is_set, timeout_s=10)
        # DONE in memory, its saved state still being written: the delete must wait for that write.
        deleting = asyncio.create_task(c.delete(submitted.id))
        assert await until(lambda: queued_behind_the_save(c, state_key("unit", submitted.id)), timeout_s=10)
        held.release.set()
        await deleting
        assert await until(held.written.is_set, timeout_s=10)
        for a in agents:
            await a.stop()
        listed = {p.id for p in (await controller(home).list()).profiles}
        return submitted.id, listed

    profile_id, listed = run(go())
    assert profile_id not in listed
    assert not open_storage(home).exists(state_key("unit", profile_id))


def test_a_watch_deleted_while_a_firing_is_being_saved_stays_deleted_after_a_restart(home, monkeypatch):
    def firing_save(key: str, data: bytes) -> bool:
        return "/watches/" in key and bool(json.loads(data)["firings"])

    held = HeldWrites(home, monkeypatch, firing_save)

    async def go():
        c = controller(home, **MONITORED)
        agents = await start_agents(c, 2)
        watch = await c.create_watch(WatchSpec(target="run", rank_lag=2, for_s=0, action="stacks"))
        agents[1].training = False  # rank 1 falls behind: the watch fires and saves its firing
        assert await until(held.entered.is_set, timeout_s=10)
        deleting = asyncio.create_task(c.delete_watch(watch.id))
        assert await until(lambda: queued_behind_the_save(c, watch_key("unit", watch.id)), timeout_s=10)
        held.release.set()
        await deleting
        assert await until(held.written.is_set, timeout_s=10)
        for a in agents:
            await a.stop()
        return watch.id, await controller(home, **MONITORED).list_watches()

    watch_id, watches = run(go())
    assert watches == []
    assert not open_storage(home).exists(watch_key("unit", watch_id))
