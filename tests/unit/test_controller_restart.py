"""A controller restarted on the same home storage, and two clusters sharing one root,
driven without Ray as in tests/unit/test_controller.py."""

from __future__ import annotations

import asyncio

from orchestrator.layout import manifest_key, owner_key
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.storage import open_storage
from tests.support.fake_agents import make_controller as controller
from tests.support.fake_agents import run, start_agents, until, wait_terminal
from tests.support.stepped_runner import Stepped


def request(steps: int = 10, **options) -> ProfileRequest:
    return ProfileRequest(target="run", steps=steps, **options)


def test_a_restarted_controller_finishes_a_profile_that_was_collecting(home):
    async def go():
        first = controller(home)
        stepped = Stepped(first)
        agents = await start_agents(first, 2)
        agents[1].behaviour = "stall_upload"
        submitted = await first.submit(request(steps=5, timeout_s=20))
        assert not await stepped.step(submitted.id)  # scheduled: the arms are sent
        await until(lambda: all(a.window_task for a in agents), timeout_s=30)
        # Rank 0 is DONE and rank 1 UPLOADING (and stays so), each acknowledged.
        await asyncio.gather(*(a.window_task for a in agents))
        assert not await stepped.step(submitted.id)  # COLLECTING, saved
        # The actor restarts: same agents, a new controller on the same home storage.
        second = controller(home)
        restored = await second.get(submitted.id)
        for a in agents:
            a.controller = second
            await a.register()
        await agents[1].finish(agents[1].windows[0])
        status, _ = await wait_terminal(second, submitted.id)
        for a in agents:
            await a.stop()
        return restored, status

    restored, status = run(go())
    assert restored.state == ProfileState.COLLECTING
    assert [r.state for r in restored.ranks] == [RankState.DONE, RankState.UPLOADING]
    assert status.state == ProfileState.DONE


def test_a_profile_whose_manifest_was_written_before_the_restart_ends_done_and_its_owner_lease_is_removed(home):
    async def go():
        first = controller(home)
        saving = first._persistence.save
        died = asyncio.Event()

        async def save_until_the_end(profile):
            if profile.state.is_terminal:  # the manifest is written: the controller dies before its final save
                died.set()
                await asyncio.Event().wait()
            await saving(profile)

        first._persistence.save = save_until_the_end
        agents = await start_agents(first, 1)
        submitted = await first.submit(request(steps=3))
        assert await until(died.is_set, timeout_s=10)
        for task in list(first._tasks):  # the actor restarts
            task.cancel()
        await agents[0].stop()
        storage = open_storage(home)
        before = (storage.exists(manifest_key("run", submitted.id)), storage.exists(owner_key("run", submitted.id)))
        status = await controller(home).get(submitted.id)
        return before, status, storage.exists(owner_key("run", submitted.id))

    before, status, lease_left = run(go())
    assert before == (True, True)  # the commit point was reached, the lease not yet removed
    assert status.state == ProfileState.DONE
    assert not lease_left


def test_a_cancel_survives_a_restart(home):
    async def go():
        first = controller(home)
        stepped = Stepped(first)
        agents = await start_agents(first, 1)
        agents[0].behaviour = "hang"
        submitted = await first.submit(request(steps=5, timeout_s=20))
        assert not await stepped.step(submitted.id)  # scheduled and saved: the arm is sent
        for a in agents:
            await a.stop()
        await first.cancel(submitted.id)
        second = controller(home)
        status, _ = await wait_terminal(second, submitted.id)
        return status

    assert run(go()).state == ProfileState.CANCELLED


def test_two_controllers_on_one_root_do_not_adopt_each_others_profiles(home):
    async def go():
        a = controller(home, cluster_name="cluster-a")
        agents = await start_agents(a, 1)
        agents[0].behaviour = "hang"
        submitted = await a.submit(request(steps=3, timeout_s=20))
        b = controller(home, cluster_name="cluster-b")
        seen_by_b = (await b.list()).total
        await a.cancel(submitted.id)
        await agents[0].stop()
        return seen_by_b

    assert run(go()) == 0
