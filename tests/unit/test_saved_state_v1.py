"""State files saved by rayprof before the record was saved as it is (``{"status": ..., "storage": ...,
"window_note", "cancel_requested", "submit_key"}``) still load: a controller upgraded in place finds
its profiles, running and finished, as they were. The files in tests/data/saved_state_v1/ were
written by that version. No Ray, no controller."""

from __future__ import annotations

import asyncio
import json
import shutil

from actors.controller.profiles.state import Profile, Record, StacksRecord
from actors.controller.saved.catalog import Catalog
from actors.controller.saved.persistence import Persistence
from orchestrator.layout import state_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.profile import ProfileStatus
from orchestrator.models.requests import ProfileState
from tests.support.common import REPO

_OLD = REPO / "tests" / "data" / "saved_state_v1"


def _restored(tmp_path) -> dict[str, Record]:
    home = StorageSpec(uri=tmp_path.as_uri())
    ids = {}
    for path in _OLD.glob("*.json"):
        profile_id = json.loads(path.read_text())["status"]["id"]
        target = tmp_path / state_key("unit", profile_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        ids[path.stem] = profile_id

    async def go() -> dict[str, Record]:
        catalog = Catalog(Persistence(home, "unit"))
        catalog.adopt(await catalog.load())
        return {name: await catalog.profile(profile_id) for name, profile_id in ids.items()}

    return asyncio.run(go())


def _old(name: str) -> dict:
    return json.loads((_OLD / f"{name}.json").read_text())


def test_every_old_state_file_loads_as_the_record_it_was(tmp_path):
    restored = _restored(tmp_path)
    for name in ("ended", "running", "bundle"):
        old = _old(name)
        # The postprocess's progress is not carried over a restart: a restored profile runs it again.
        expected = ProfileStatus.model_validate(old["status"]).model_copy(update={"postprocess": None})
        assert restored[name].snapshot() == expected, name
        assert restored[name].storage == StorageSpec.model_validate(old["storage"]), name
        # A bundle is its own kind now: no window, so nothing to cancel (its old file said false).
        assert getattr(restored[name], "cancel_requested", False) == old["cancel_requested"], name
    assert isinstance(restored["bundle"], StacksRecord) and isinstance(restored["ended"], Profile)


def test_what_only_the_saved_file_held_comes_back(tmp_path):
    restored = _restored(tmp_path)
    running, ended = restored["running"], restored["ended"]
    assert isinstance(running, Profile) and isinstance(ended, Profile)
    assert running.state == ProfileState.CAPTURING and running.window is not None
    assert (running.window.start_step, running.window.steps, running.window.note) == (
        100, 20, "shortened to 20 steps by the byte cap"
    )
    assert running.cancel_requested and running.postprocess is None
    assert ended.submit_key is not None and ended.submit_key.key == "k-1"
    assert ended.window is not None and ended.window.note is None


def test_an_old_bundle_with_the_invented_request_loads_without_one(tmp_path):
    bundle = _restored(tmp_path)["bundle_with_request"]
    assert isinstance(bundle, StacksRecord) and bundle.kind == "stacks" and bundle.target == "run"
    assert bundle.snapshot().request is None
