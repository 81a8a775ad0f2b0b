"""Cluster storage never follows a symbolic link out of its root, never deletes through one, and a
delete leaves no empty folder for the next gc to list again (issue 22, item 7)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.errors import StorageError
from orchestrator.layout import profile_id
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.summaries import GcRequest
from orchestrator.storage import FileStorage
from tests.support.fake_agents import make_controller, run


def old_id() -> str:
    return profile_id("prof", utcnow() - timedelta(days=2), uuid.uuid4().hex[:8])


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to the root, with a file nobody may touch."""
    folder = tmp_path / "outside"
    (folder / old_id() / "traces").mkdir(parents=True)
    for sub in folder.iterdir():
        (sub / "traces" / "keep.json").write_text("precious")
    (folder / "secret.txt").write_text("precious")
    return folder


def precious(outside: Path) -> list[str]:
    return sorted(str(p.relative_to(outside)) for p in outside.rglob("*") if p.is_file())


def gc(root: Path):
    home = StorageSpec(uri=str(root))
    return run(make_controller(home).gc(GcRequest()))


def test_gc_does_not_follow_a_target_folder_linked_out_of_the_root(tmp_path, outside):
    root = tmp_path / "store"
    root.mkdir()
    before = precious(outside)
    (root / "run").symlink_to(outside, target_is_directory=True)

    report = gc(root)

    assert report.leftovers == [] and report.failed == []
    assert precious(outside) == before


def test_gc_deletes_a_leftover_but_not_what_a_link_inside_it_points_to(tmp_path, outside):
    root = tmp_path / "store"
    leftover = root / "run" / old_id()
    (leftover / "traces").mkdir(parents=True)
    (leftover / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"partial")
    (leftover / "memory").symlink_to(outside, target_is_directory=True)
    (leftover / "ops.csv").symlink_to(outside / "secret.txt")
    before = precious(outside)

    report = gc(root)

    assert [x.profile_id for x in report.leftovers] == [leftover.name]
    assert precious(outside) == before
    assert not (leftover / "traces").exists()


def test_a_delete_through_a_linked_folder_is_refused(tmp_path, outside):
    storage = FileStorage(tmp_path / "store")
    (storage.root / "run").mkdir(parents=True)
    (storage.root / "run" / "linked").symlink_to(outside, target_is_directory=True)

    with pytest.raises(StorageError, match="symbolic link"):
        storage.delete("run/linked/secret.txt")
    assert (outside / "secret.txt").read_text() == "precious"
    assert storage.list("run/") == [] and storage.folders("run") == []


def test_reads_and_writes_through_a_link_out_of_the_root_are_refused(tmp_path, outside):
    storage = FileStorage(tmp_path / "store")
    storage.root.mkdir(parents=True)
    (storage.root / "run").symlink_to(outside, target_is_directory=True)

    with pytest.raises(StorageError, match="out of the storage root"):
        storage.put_bytes(b"x", "run/new.txt", "manifest")
    with pytest.raises(StorageError, match="out of the storage root"):
        storage.get_bytes("run/secret.txt")
    assert not (outside / "new.txt").exists()


def test_a_delete_removes_the_folders_it_empties_and_the_next_gc_reports_nothing(tmp_path):
    root = tmp_path / "store"
    storage = FileStorage(root)
    first, second = old_id(), old_id()
    for folder_id in (first, second):
        storage.put_bytes(b"partial", f"run/{folder_id}/traces/rank0.pt.trace.json.gz", "trace")
    storage.put_bytes(b"{}", "_rayprof/c/profiles/x.json", "manifest")

    report = gc(root)
    again = gc(root)

    assert sorted(x.profile_id for x in report.leftovers) == sorted([first, second])
    assert again.leftovers == []
    assert not (root / "run").exists() and (root / "_rayprof" / "c" / "profiles" / "x.json").exists()


def test_an_empty_folder_left_by_an_older_version_is_not_reported(tmp_path):
    root = tmp_path / "store"
    (root / "run" / old_id()).mkdir(parents=True)

    assert gc(root).leftovers == []


def test_a_write_into_a_folder_a_delete_just_removed_makes_it_again(tmp_path):
    storage = FileStorage(tmp_path / "store")
    storage.put_bytes(b"a", "run/p/a.txt", "manifest")
    storage.delete("run/p/a.txt")
    assert not (storage.root / "run").exists()

    storage.put_bytes(b"b", "run/p/b.txt", "manifest")

    assert storage.list("run/") == ["run/p/b.txt"]
