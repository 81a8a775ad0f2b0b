"""What a controller restart (or a worker's) must not leave wedged: a post-window check in progress,
a watch firing between its action and its save, a command queued to a worker that re-registered."""

from __future__ import annotations

import asyncio

from actors.controller.agents.registry import Registry
from orchestrator.errors import StorageError
from orchestrator.models.agent_protocol import CancelCommand, SyncCommand
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.fake_agents import (
    MONITORED,
    make_controller,
    run,
    start_agents,
    status_when,
    until,
    wait_terminal,
    worker_info,
)


def test_a_post_window_check_in_progress_at_a_restart_ends_instead_of_staying_pending(home):
    # A check needs far more steps after the window than this run will make: it is pending when the
    # controller restarts, and the window was long enough for the pending check to be saved with it.
    settings = dict(MONITORED, post_window_steps=100_000)

    async def scenario():
        first = make_controller(home, **settings)
        agents = await start_agents(first, 2, step_s=0.05)
        await first.ping()
        submitted = await first.submit(ProfileRequest(target="run", steps=20))
        ended, _ = await wait_terminal(first, submitted.id, timeout_s=20)
        for a in agents:
            await a.stop()
        second = make_controller(home, **settings)
        await second.ping()
        restored = await second.get(submitted.id)
        later = await status_when(
            second, submitted.id, lambda s: s.post_window is not None and s.post_window.final, timeout_s=10
        )
        return ended, restored, later

    ended, restored, later = run(scenario(), timeout_s=60)
    assert ended.post_window is not None and ended.post_window.verdict == "pending"  # as saved
    assert restored.post_window is not None and not restored.post_window.final
    assert later.post_window is not None and later.post_window.final, later.post_window
    assert later.post_window.verdict == "unknown"


def test_a_watch_that_crashed_between_its_action_and_its_save_does_not_fire_again_at_once(home):
    spec = WatchSpec(target="run", every_s=600, action="stacks", cooldown_s=0, max_per_hour=6)

    async def scenario():
        first = make_controller(home, **MONITORED)
        agents = await start_agents(first, 2)
        save_watch = first._persistence.save_watch

        async def lost_after_the_action(status):
            # The process dies once the action is done: no save after it ever lands.
            if any(p.kind == "stacks" for p in first._catalog.known()) or first._catalog.finished:
                raise StorageError("the controller died before this save")
            await save_watch(status)

        first._persistence.save_watch = lost_after_the_action
        watch = await first.create_watch(spec)
        assert await until(lambda: len(first._watches.get(watch.id).firings) == 1, timeout_s=20)
        for a in agents:
            await a.stop()
        second = make_controller(home, **MONITORED)
        await second.ping()
        agents = await start_agents(second, 2)
        # The restored watch is evaluated with its target live: it either fires, or says when it is due.
        evaluated = await until(
            lambda: second._watches.get(watch.id).firings or second._watches.get(watch.id).observed is not None,
            timeout_s=20,
        )
        for a in agents:
            await a.stop()
        return evaluated, await second.get_watch(watch.id), await second.list()

    evaluated, restored, page = run(scenario(), timeout_s=90)
    assert evaluated
    assert restored.firings == [] or len(restored.fired_at) == 1, restored
    assert [p.kind for p in page.profiles] == ["stacks"], page.profiles  # the first controller's, only
    assert restored.next_at is not None and restored.next_at > restored.created_at


def test_a_command_queued_to_a_worker_that_expires_and_re_registers_is_delivered(home):
    # Rank 1's agent stops calling (a long pause) while its stacks are asked for: its worker expires, is
    # dropped, and the agent re-registers when it calls again. Its stacks command must reach it then.
    async def scenario():
        c = make_controller(home, stacks_timeout_s=20.0)
        agents = await start_agents(c, 2)
        await c.ping()
        paused = agents[1]
        poll = paused.poll_task
        assert poll is not None
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        taking = asyncio.ensure_future(c.stacks("run"))
        assert await until(lambda: paused.info.agent_id not in c._registry.workers, timeout_s=10)
        paused._tasks.append(asyncio.create_task(paused._poll()))  # the pause ends: it calls again
        bundle = await asyncio.wait_for(taking, 30)
        for a in agents:
            await a.stop()
        return bundle

    bundle = run(scenario(), timeout_s=60)
    assert bundle.state == ProfileState.DONE, bundle.missing


def test_a_command_queued_to_a_dropped_worker_reaches_it_when_it_registers_again_and_only_it():
    registry = Registry()
    info = worker_info(0, 2)
    worker, _ = registry.register(info)
    assert worker is not None
    queued = SyncCommand()
    worker.send(queued)
    registry.drop(info.agent_id, "no heartbeat for over 20s")
    other, _ = registry.register(worker_info(1, 2))  # another agent gets nothing of it
    again, _ = registry.register(info)
    assert other is not None and not other.commands
    assert again is not None and list(again.commands) == [queued]
    again.commands.popleft()  # its poll took it
    registry.drop(info.agent_id, "no heartbeat for over 20s")
    assert not registry.register(info)[0].commands  # delivered once, not twice


def test_a_command_sent_to_a_worker_after_it_was_dropped_reaches_it_when_it_registers_again():
    registry = Registry()
    info = worker_info(0, 2)
    registry.register(info)
    registry.drop(info.agent_id, "no heartbeat for over 20s")
    cancel = CancelCommand(profile_id="prof-1")
    registry.send(info.agent_id, cancel)  # its window's rank ended while it was away
    again, _ = registry.register(info)
    assert again is not None and list(again.commands) == [cancel]
