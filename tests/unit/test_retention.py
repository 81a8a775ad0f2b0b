"""Retention's rounds: what a failed delete left is deleted later even if nothing else ends."""

from __future__ import annotations

from actors.controller.saved import retention
from orchestrator.errors import StorageError
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Trigger
from tests.support.fake_agents import MONITORED, make_controller, run, start_agents, until


def test_a_delete_that_failed_is_retried_from_the_monitor_tick_when_nothing_else_ends(home, monkeypatch):
    monkeypatch.setattr(retention, "RETRY_S", 0.2)
    real_delete = retention.Retention.delete
    failures = [1]

    async def delete_failing_once(self, entry):
        if failures[0]:
            failures[0] -= 1
            raise StorageError("the store is away for a moment")
        await real_delete(self, entry)

    monkeypatch.setattr(retention.Retention, "delete", delete_failing_once)

    async def go():
        c = make_controller(home, **{**MONITORED, "retention_auto_count": 1, "stall_auto_stacks": False})
        agents = await start_agents(c, 2)
        stalled = Trigger(kind="stalled", at=utcnow(), detail="a test's stall")
        older = await c._take_stacks("run", None, False, stalled)
        newer = await c._take_stacks("run", None, False, stalled)  # its round fails to delete the older one
        listed_after_the_failure = [p.id for p in (await c.list()).profiles]
        # Nothing ends from here on: only the monitor tick can finish what the failed round left.
        deleted = await until(lambda: older.id not in c._catalog, timeout_s=20)
        listed_at_the_end = [p.id for p in (await c.list()).profiles]
        for a in agents:
            await a.stop()
        return older, newer, listed_after_the_failure, deleted, listed_at_the_end

    older, newer, after_failure, deleted, at_end = run(go())
    assert failures == [0] and sorted(after_failure) == sorted([older.id, newer.id])
    assert deleted and at_end == [newer.id]
