"""`rayprof report ID` downloads into a cache it reuses and trims: before, every call downloaded the whole profile
into a new temp folder and left it there (a GPU job's profile can be GBs)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from orchestrator.cli import commands, diff_command
from orchestrator.cli.report_cache import cached_folder, keep_latest
from orchestrator.client.client import ProfileHandle
from orchestrator.errors import ConfigurationError
from orchestrator.layout import MANIFEST_NAME, profile_prefix
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.storage import FileStorage
from tests.support.common import cli_results
from tests.support.tracefiles import write_trace, x_event

TARGET = "run"


def _profile(store: Path, tmp_path: Path, profile_id: str) -> ProfileHandle:
    """A stored profile of one rank's trace, and a handle whose service answers for it."""
    trace = write_trace(tmp_path / "src.pt.trace.json", [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation")])
    folder = FileStorage(store).scoped(profile_prefix(TARGET, profile_id))
    artifact = folder.put_bytes(trace.read_bytes(), "traces/rank0.pt.trace.json", "trace")
    manifest = {
        "profile_id": profile_id, "target": TARGET, "status": "DONE", "request": {"target": TARGET, "steps": 1},
        "storage_uri": store.as_uri(), "start_step": 1, "stop_step": 1,
        "ranks": [{"rank": 0, "state": "DONE", "artifacts": [artifact.model_dump()]}],
        "requested_at": "2024-01-01T00:00:00Z", "finished_at": "2024-01-01T00:00:01Z",
    }
    folder.put_bytes(json.dumps(manifest).encode(), MANIFEST_NAME, "manifest")

    class Backend:
        def call(self, name: str, *args):
            if name == "manifest":
                return Manifest.model_validate(manifest)
            assert name == "profile_storage"
            return StorageSpec(uri=store.as_uri())

    status = ProfileStatus.model_validate(
        {"id": profile_id, "target": TARGET, "state": "DONE", "request": {"target": TARGET, "steps": 1},
         "storage_uri": store.as_uri(), "created_at": "2024-01-01T00:00:00Z"}
    )
    return ProfileHandle(Backend(), status)  # type: ignore[arg-type]


def test_report_of_an_id_downloads_into_the_cache_and_reuses_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAYPROF_CACHE_DIR", str(tmp_path / "cache"))
    handle = _profile(tmp_path / "store", tmp_path, "prof-1")
    monkeypatch.setattr(commands, "_client", lambda args: type("C", (), {"get": lambda self, i: handle})())
    args = argparse.Namespace(source="prof-1", dest=None, json=True, out=None)

    assert cli_results(commands.report, args)[0] == 0
    cached = tmp_path / "cache" / "profiles" / TARGET / "prof-1"
    assert (cached / "traces" / "rank0.pt.trace.json").is_file() and (cached / "report.html").is_file()
    # Reported again with its stored trace gone: the cached copy is used, not fetched again.
    (tmp_path / "store" / TARGET / "prof-1" / "traces" / "rank0.pt.trace.json").unlink()
    assert cli_results(commands.report, args)[0] == 0


def _aged(root: Path, names: list[str]) -> list[Path]:
    """Cached profile folders, the first least recently used."""
    folders = []
    for age, name in enumerate(reversed(names)):
        folder = cached_folder(TARGET, name, root)
        folder.mkdir(parents=True)
        os.utime(folder, (1_000_000 - age * 60, 1_000_000 - age * 60))
        folders.append(folder)
    return folders[::-1]


def test_the_cache_keeps_the_most_recently_reported_profiles(tmp_path) -> None:
    oldest, old, new, newest = _aged(tmp_path, ["a", "b", "c", "d"])

    removed = keep_latest(old, kept=2)

    assert removed == [new, oldest]
    assert sorted(p.name for p in (tmp_path / "profiles" / TARGET).iterdir()) == ["b", "d"]


def test_a_cache_of_one_keeps_the_profile_just_reported(tmp_path) -> None:
    (oldest, newest) = _aged(tmp_path, ["a", "b"])

    keep_latest(oldest, kept=1)

    assert [p.name for p in (tmp_path / "profiles" / TARGET).iterdir()] == ["a"]


def test_a_cache_that_keeps_no_profile_is_a_configuration_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAYPROF_CACHE_PROFILES", "0")
    (folder,) = _aged(tmp_path, ["a"])
    with pytest.raises(ConfigurationError, match="RAYPROF_CACHE_PROFILES=0 keeps no profile: use 1 or more"):
        keep_latest(folder)


def test_files_beside_the_cached_profiles_are_left_alone(tmp_path) -> None:
    (oldest, newest) = _aged(tmp_path, ["a", "b"])
    (tmp_path / "profiles" / "notes.txt").write_text("mine")
    (tmp_path / "profiles" / TARGET / "stray").write_text("mine")

    assert keep_latest(newest, kept=1) == [oldest]
    assert sorted(p.name for p in (tmp_path / "profiles" / TARGET).iterdir()) == ["b", "stray"]


def test_diff_of_a_stored_profile_and_a_folder_reads_the_stored_one_from_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAYPROF_CACHE_DIR", str(tmp_path / "cache"))
    handle = _profile(tmp_path / "store", tmp_path, "prof-1")
    monkeypatch.setattr(commands, "_client", lambda args: type("C", (), {"get": lambda self, i: handle})())
    local = tmp_path / "local"
    (local / "traces").mkdir(parents=True)
    (local / "traces" / "rank0.pt.trace.json").write_bytes((tmp_path / "src.pt.trace.json").read_bytes())

    result = diff_command._compute(argparse.Namespace(a="prof-1", b=str(local)))

    assert (result.a.label, result.b.label) == ("prof-1", str(local))
    assert (tmp_path / "cache" / "profiles" / TARGET / "prof-1" / "traces" / "rank0.pt.trace.json").is_file()
