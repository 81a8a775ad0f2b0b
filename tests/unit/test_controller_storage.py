"""The control actor when its home storage fails: it answers, it does not acknowledge what it could
not save, and it says why a profile failed. The real ``Controller`` class with fake agents, without Ray."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path

import pytest

from actors.controller.actor import Controller
from orchestrator.build import build_id
from orchestrator.errors import RestoringError, StorageError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.fake_agents import (
    FAKE_RAY_CLUSTER,
    fast_config,
    no_postprocess,
    run,
    start_agents,
    status_when,
    wait_terminal,
    worker_info,
)
from tests.support.fake_agents import make_controller as controller
from tests.support.local_recorder import LocalRecorders
from tests.support.stepped_runner import ManualClock, Stepped


def request(steps: int = 10, **options) -> ProfileRequest:
    return ProfileRequest(target="run", steps=steps, **options)


def _broken_home(tmp_path: Path) -> StorageSpec:
    # A folder whose parent is a plain file: every read and write fails with an OSError.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    return StorageSpec(uri=str(blocker / "store"))


def test_unreachable_home_storage_does_not_wedge_the_controller(tmp_path):
    async def go():
        c = Controller(
            fast_config(_broken_home(tmp_path)), postprocess=no_postprocess, cluster=FAKE_RAY_CLUSTER, recorder=LocalRecorders()
        )
        pong = await asyncio.wait_for(c.ping(), 5)
        await c.register(worker_info(0, 1))
        targets = await c.targets()
        # Calls on saved state say why they cannot answer yet, instead of an empty list or a wrong storage.
        with pytest.raises(RestoringError, match="not restored its saved state .* Not a directory"):
            await c.submit(request())
        with pytest.raises(RestoringError):
            await c.list()
        with pytest.raises(RestoringError):
            await c.config()
        return pong, targets

    pong, targets = run(go())
    assert pong == build_id()
    assert [t.name for t in targets] == ["run"]


async def saved_as(store: Path, profile_id: str, state: str) -> None:
    """Wait until the controller's saved copy of a profile shows ``state`` (saves trail the in-memory state)."""
    for _ in range(100):
        saved = list(store.glob(f"_rayprof/*/profiles/{profile_id}.json"))
        # The profile's own state: its ranks' states are in the same file.
        if saved and json.loads(saved[0].read_text())["state"] == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{profile_id} never saved as {state}")


def test_saved_state_is_restored_once_storage_comes_back(tmp_path, home):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        done, _ = await wait_terminal(c, (await c.submit(request(steps=3))).id)
        for a in agents:
            await a.stop()
        store = Path(home.uri.removeprefix("file://"))
        await saved_as(store, done.id, "DONE")
        hidden = store.with_name("hidden")
        store.rename(hidden)
        store.parent.joinpath("store").write_text("outage")  # the root is now a file: every read fails
        restarted = controller(home)
        with pytest.raises(RestoringError):
            await restarted.list()
        Path(store).unlink()
        hidden.rename(store)
        for _ in range(100):
            with contextlib.suppress(RestoringError):
                if (await restarted.list()).total:
                    break
            await asyncio.sleep(0.1)
        return done, await restarted.get(done.id)

    done, after = run(go())
    assert after.state == done.state == ProfileState.DONE


def test_a_result_that_cannot_be_saved_is_not_acknowledged(home, tmp_path):
    async def go():
        c = controller(home)
        agents = await start_agents(c, 1)
        agents[0].behaviour = "hang"
        submitted = await c.submit(request(steps=3, timeout_s=20))
        await status_when(c, submitted.id, lambda s: bool(s.ranks) and s.ranks[0].state == RankState.CAPTURING, timeout_s=30)
        store = Path(home.uri.removeprefix("file://"))
        store.rename(store.with_name("away"))
        store.write_text("outage")
        window = agents[0].windows[0]
        with pytest.raises(StorageError):
            await agents[0].report(window, RankState.FAILED, reason="planted")
        await agents[0].stop()

    run(go())


def test_a_manifest_that_cannot_be_written_ends_the_profile_failed_with_the_reason(tmp_path, home):
    async def go():
        clock = ManualClock()
        c = controller(home, clock, worker_expiry_grace_s=60.0)  # jumps past the timeout drop no agent
        stepped = Stepped(c)
        agents = await start_agents(c, 1)
        agents[0].behaviour = "hang"
        submitted = await c.submit(request(steps=3, timeout_s=1.0))
        # The profile's folder (holding only its owner lease so far) becomes a file: the manifest cannot be written there.
        folder = Path(home.uri.removeprefix("file://")) / "run" / submitted.id
        shutil.rmtree(folder)
        folder.write_text("in the way")
        await stepped.step(submitted.id)  # scheduled and armed
        await status_when(c, submitted.id, lambda s: bool(s.ranks) and s.ranks[0].state == RankState.CAPTURING, timeout_s=10)
        clock.advance(1.0)  # the timeout passes
        assert await stepped.step(submitted.id)
        status = await c.get(submitted.id)
        await agents[0].stop()
        return status

    status = run(go())
    assert status.state == ProfileState.FAILED
    assert status.reason.startswith("could not write the manifest")


def test_a_manifest_write_that_fails_once_is_retried_and_the_profile_ends_done(home, monkeypatch):
    # Every artifact is stored when the manifest is written: one failed write must not fail the profile.
    from orchestrator.storage.local import FileStorage

    put_bytes = FileStorage.put_bytes
    failed: list[str] = []

    def flaky(self, data, key, *args, **kwargs):
        if key.endswith("manifest.json") and not failed:
            failed.append(key)
            raise StorageError(f"injected failure writing {key}")
        return put_bytes(self, data, key, *args, **kwargs)

    monkeypatch.setattr(FileStorage, "put_bytes", flaky)

    async def go():
        c = controller(home)
        agents = await start_agents(c, 2)
        submitted = await c.submit(request(steps=2))
        status, _ = await wait_terminal(c, submitted.id, timeout_s=20.0)
        manifest = await c.manifest(submitted.id)
        for agent in agents:
            await agent.stop()
        return status, manifest

    status, manifest = run(go())
    assert failed, "the injected failure never happened"
    assert status.state == ProfileState.DONE
    assert manifest.profile_id == status.id
