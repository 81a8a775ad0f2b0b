"""Watches on a schedule: a profile (or stacks) due at creation and then every ``every_s``, fired on the
controller's monitor tick, kept to the watch's cooldown, cap and failure rules, stored as automatic
profiles, and counted on across a controller restart.

The real ``Controller`` with fake agents, without Ray, on the test's ``ManualClock``: the test moves
its wall clock forward instead of waiting out the minutes between firings, and steps the monitor
tick (``SteppedMonitor``), on which the fake agents train too.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from actors.controller.actor import Controller
from orchestrator.cli import stacks_commands as cli
from orchestrator.cli.main import main
from orchestrator.errors import InvalidWatchError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.diagnosis import WatchSpec, WatchStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.fake_agents import MONITORED, make_controller, until_saved
from tests.support.fake_agents import run as run_bounded
from tests.support.inprocess_service import service_client
from tests.support.stepped_runner import ManualClock, SteppedMonitor


def run(coro):
    return run_bounded(coro, 90)


def stepped(home: StorageSpec, clock: ManualClock, **overrides) -> SteppedMonitor:
    return SteppedMonitor(make_controller(home, clock, **{**MONITORED, **overrides}), clock)


def has_firings(c: Controller, watch_id: str, n: int):
    return lambda: len(c._watches.get(watch_id).firings) == n


def every_minute(**overrides) -> WatchSpec:
    """The tightest schedule allowed: once a minute, with a cooldown and cap that let it."""
    values = dict(target="run", every_s=60, profile_steps=2, cooldown_s=60, max_per_hour=60)
    values.update(overrides)
    return WatchSpec(**values)


async def firings(c: Controller, watch_id: str) -> int:
    return len((await c.get_watch(watch_id)).firings)


async def stop_all(agents) -> None:
    for a in agents:
        await a.stop()


def test_a_schedule_profiles_now_and_then_once_per_period_as_automatic_profiles(home):
    clock = ManualClock()

    async def go():
        m = stepped(home, clock, retention_count=1, retention_auto_count=2)
        c = m.c
        agents = await m.start_agents(2)
        asked = await m.until_terminal((await c.submit(ProfileRequest(target="run", steps=2))).id)
        watch = await c.create_watch(every_minute())
        seen = [await m.tick_until(has_firings(c, watch.id, 1), max_ticks=400)]
        first = await c.get_watch(watch.id)
        await m.until_terminal(first.firings[0].profile_id)
        await m.ticks(20)  # 20 ticks, none of them due
        quiet = await firings(c, watch.id)
        for n in (2, 3):
            clock.forward(61)
            seen.append(await m.tick_until(has_firings(c, watch.id, n), max_ticks=400))
            await m.until_terminal(c._watches.get(watch.id).firings[-1].profile_id)
        state = await c.get_watch(watch.id)
        for _ in range(100):  # retention runs once the last profile is recorded as ended
            page = await c.list()
            if sum(p.trigger is not None for p in page.profiles) <= 2:
                break
            await asyncio.sleep(0.05)
        await stop_all(agents)
        return asked, first, quiet, seen, state, page

    asked, first, quiet, seen, state, page = run(go())
    assert all(seen) and quiet == 1
    assert first.firings[0].at == first.created_at  # due at creation
    assert first.next_at == first.created_at + timedelta(seconds=60)
    triggers = [f.trigger for f in state.firings]
    assert [t.kind for t in triggers] == ["schedule"] * 3 and {t.watch_id for t in triggers} == {state.id}
    assert triggers[0].observed is None and triggers[1].observed == pytest.approx(61)
    assert all(f.error is None for f in state.firings) and state.failures == 0
    assert state.next_at == state.firings[-1].at + timedelta(seconds=60)
    # Scheduled profiles are automatic: the newest two kept, the one someone asked for never pushed out.
    requested = [p.id for p in page.profiles if p.trigger is None]
    automatic = sorted(p.id for p in page.profiles if p.trigger is not None)
    assert requested == [asked.id]
    assert automatic == sorted(f.profile_id for f in state.firings[1:])
    assert all(p.state == ProfileState.DONE for p in page.profiles)


def test_a_due_schedule_fires_on_the_monitor_tick_while_no_rank_steps(home):
    # Stacks of a run that takes no steps: the firing comes from the controller's tick, not a step.
    clock = ManualClock()

    async def go():
        m = stepped(home, clock, stall_auto_stacks=False)
        c = m.c
        agents = await m.start_agents(2)
        for a in agents:
            a.training = False
        await m.ticks(6)
        watch = await c.create_watch(every_minute(action="stacks"))
        done = await m.tick_until(has_firings(c, watch.id, 1), max_ticks=400)
        steps = [a.step for a in agents]
        page = await c.list()
        await stop_all(agents)
        return done, steps, page, await c.get_watch(watch.id)

    fired, steps, page, state = run(go())
    assert fired and steps == [steps[0]] * 2
    assert [p.id for p in page.profiles] == [state.firings[0].profile_id]
    assert page.profiles[0].kind == "stacks" and page.profiles[0].trigger.kind == "schedule"


def test_a_restart_counts_on_from_the_last_firing_and_fires_only_when_due(home):
    clock = ManualClock()

    async def restarted(at: datetime, firings: int):
        """A restart at ``at``, ticked 1.5 s or until the watch has ``firings``."""
        clock.at = at
        m = stepped(home, clock)
        agents = await m.start_agents(2)
        await m.tick_until(lambda: len(m.c._watches.list()[0].firings) >= firings, max_ticks=30)
        watches = await m.c.list_watches()
        await stop_all(agents)
        return watches[0]

    async def go():
        m = stepped(home, clock)
        c = m.c
        agents = await m.start_agents(2)
        watch = await c.create_watch(every_minute(action="stacks", every_s=600, cooldown_s=0, max_per_hour=6))
        await m.tick_until(has_firings(c, watch.id, 1), max_ticks=400)
        await until_saved(home, watch.id, lambda w: len(w.firings) == 1, timeout_s=20)
        await stop_all(agents)
        created = watch.created_at
        not_due = await restarted(created + timedelta(seconds=300), 2)
        overdue = await restarted(created + timedelta(seconds=700), 2)
        return watch, not_due, overdue

    watch, not_due, overdue = run(go())
    first = watch.created_at
    assert len(not_due.firings) == 1 and not_due.next_at == first + timedelta(seconds=600)
    assert not_due.state == "WAITING"
    # Due (overdue) when the controller came back: fired once at once, and counts on from that firing.
    assert [f.at for f in overdue.firings] == [first, first + timedelta(seconds=700)]
    assert overdue.next_at == first + timedelta(seconds=1300)


def test_a_failing_schedule_counts_toward_the_failure_limit_and_pauses(home):
    clock = ManualClock()

    async def go():
        m = stepped(home, clock, max_steps=2, watch_max_failures=2)
        c = m.c
        agents = await m.start_agents(2)
        watch = await c.create_watch(every_minute())
        # Planted: the server's limit falls below the watch's steps after it was created.
        c._settings.update(max_steps=1)
        await m.tick_until(has_firings(c, watch.id, 1), max_ticks=400)
        await m.ticks(10)
        waiting = await c.get_watch(watch.id)  # failed once; the next try a period later, not next tick
        clock.forward(61)
        paused = await m.tick_until(lambda: c._watches.get(watch.id).state == "PAUSED", max_ticks=400)
        clock.forward(3600)
        await m.ticks(10)
        state = await c.get_watch(watch.id)
        await stop_all(agents)
        return waiting, paused, state, await c.list()

    waiting, paused, state, page = run(go())
    assert len(waiting.firings) == 1 and waiting.failures == 1 and waiting.state != "PAUSED"
    assert paused and len(state.firings) == 2 and all("RAYPROF_MAX_STEPS" in f.error for f in state.firings)
    assert "2 times in a row" in state.paused
    assert page.profiles == []


# ---- checked at creation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, why",
    [
        (dict(every_s=30, cooldown_s=0, max_per_hour=60), "under the minimum of 60s"),
        (dict(every_s=300, max_per_hour=12), "cooldown_s=600 is longer than every_s=300"),
        (dict(every_s=600), "raise max_per_hour to 6"),
        (dict(every_s=1800, for_s=60), "for_s is how long a condition holds"),
        (dict(every_s=1800, baseline_s=60), "baseline_s is slower_than's baseline"),
        (dict(every_s=1800, profile_steps=51), "RAYPROF_MAX_STEPS"),
    ],
)
def test_a_schedule_that_would_not_keep_its_period_is_refused(home, fields, why):
    async def go():
        c = stepped(home, ManualClock()).c
        with pytest.raises(InvalidWatchError, match=why):
            await c.create_watch(WatchSpec(target="run", **fields))
        return await c.list_watches()

    assert run(go()) == []


def test_every_problem_of_a_schedule_is_named_at_once(home):
    async def go():
        c = stepped(home, ManualClock()).c
        with pytest.raises(InvalidWatchError) as refused:
            await c.create_watch(WatchSpec(target="run", every_s=30, for_s=5))
        return refused.value.message

    message = run(go())
    for why in ("minimum of 60s", "cooldown_s=600", "max_per_hour to 120", "for_s"):
        assert why in message


def test_a_period_of_a_few_ulps_is_refused_as_under_the_minimum_not_an_internal_error(home):
    # Found by the schema fuzzer: every_s=5e-324 passes the model's gt=0, and 3600 / 5e-324 is infinite.
    async def go():
        c = stepped(home, ManualClock()).c
        with pytest.raises(InvalidWatchError) as refused:
            await c.create_watch(WatchSpec(target="run", every_s=5e-324, cooldown_s=0))
        return refused.value.message, await c.list_watches()

    message, watches = run(go())
    assert "every_s=4.94066e-324 is under the minimum of 60s" in message and "lengthen every_s" in message
    assert watches == []


def test_over_http_a_bad_schedule_is_a_422_and_a_good_one_is_created(home, monkeypatch):
    async def go():
        c = stepped(home, ManualClock()).c
        async with service_client(monkeypatch, c) as http:
            short = await http.post("/v1/watches", json={"target": "run", "every_s": 10})
            mixed = await http.post("/v1/watches", json={"target": "run", "every_s": 1800, "stalled": True})
            good = await http.post("/v1/watches", json={"target": "run", "every_s": 1800, "profile_steps": 3})
            listed = await http.get("/v1/watches")
        return short, mixed, good, listed

    short, mixed, good, listed = run(go())
    assert short.status_code == 422 and short.json()["error"] == "invalid_watch"
    assert "minimum of 60s" in short.json()["detail"]
    assert mixed.status_code == 422 and "exactly one condition" in mixed.json()["detail"]
    assert good.status_code == 201
    created = WatchStatus.model_validate(good.json())
    assert created.spec.every_s == 1800 and created.next_at == created.created_at
    assert [w["id"] for w in listed.json()["watches"]] == [created.id]


# ---- the CLI -----------------------------------------------------------------------------------


def test_the_cli_creates_a_schedule_and_lists_its_next_firing(monkeypatch, capsys):
    sent: list[WatchSpec] = []
    at = datetime.fromisoformat("2026-11-25T06:30:00+00:00")

    class Client:
        def watch(self, target, **options):
            sent.append(WatchSpec(target=target, **options))
            return WatchStatus(id="watch-1", spec=sent[-1], created_at=at, state="WAITING", next_at=at)

        def watches(self):
            return [WatchStatus(id="watch-1", spec=sent[-1], created_at=at, state="WAITING", next_at=at)]

    monkeypatch.setattr(cli, "_client", lambda args: Client())
    created = main(["watch", "my-run", "--every", "30m", "--then-profile", "3"])
    listed = main(["watches"])
    text = capsys.readouterr().out
    with pytest.raises(SystemExit) as mixed:
        main(["watch", "my-run", "--every", "30m", "--stalled"])

    assert created == listed == 0 and mixed.value.code == 2
    assert sent[0].every_s == 1800 and sent[0].profile_steps == 3 and sent[0].action == "profile"
    assert "watch-1  watching my-run: every 30m, profile 3 steps on all ranks" in text
    assert "next 2026-11-25 06:30:00 UTC" in text
