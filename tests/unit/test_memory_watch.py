"""An OOM watch on one rank (actors/agent/memory_watch.py), with the CUDA allocator faked:
recording on command, the snapshot of an out-of-memory error kept before the job sees it,
snapshots stored on request."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch

from actors.agent.capture import Capture
from actors.agent.memory_watch import OOM_MIN_INTERVAL_S, MemoryWatch
from orchestrator.models.agent_protocol import OomReport, SnapshotDestination, StorageSpec
from tests.support.fake_allocator import FakeAllocator
from tests.unit.test_capture import INFO
from tests.unit.test_memory_snapshot import _train, _window

MiB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(allocator: FakeAllocator, clock: Clock | None = None) -> tuple[MemoryWatch, list[OomReport]]:
    reports: list[OomReport] = []
    return MemoryWatch(INFO, allocator, reports.append, clock or Clock()), reports


def _dest(tmp_path) -> SnapshotDestination:
    return SnapshotDestination(storage=StorageSpec(uri=str(tmp_path / "store")), prefix="unit/oom1")


def test_recording_follows_the_command_and_the_observer_is_attached_once():
    allocator = FakeAllocator()
    watch, _ = _watch(allocator)

    watch.record(True)
    watch.record(True)
    assert (allocator.recording, allocator.starts, len(allocator.observers)) == (True, 1, 1)
    watch.record(False)
    watch.record(True)
    assert allocator.recording and len(allocator.observers) == 1


def test_a_rank_without_cuda_records_nothing():
    allocator = FakeAllocator(unavailable="this worker has no CUDA device")
    watch, _ = _watch(allocator)

    watch.record(True)

    assert (watch.recording, allocator.starts, allocator.observers) == (False, 0, [])


def test_an_oom_keeps_the_snapshot_and_reports_before_the_job_sees_the_unchanged_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPROF_OOM_HOLD_S", "0.01")
    allocator = FakeAllocator()
    watch, reports = _watch(allocator)
    watch.record(True)
    allocator.alloc(1, 6 * MiB)

    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 1048576000 bytes"):
        allocator.oom(1000 * MiB, device_free=3 * MiB)

    assert [(r.asked_bytes, r.free_bytes) for r in reports] == [(1000 * MiB, 3 * MiB)]
    artifacts, note = watch.snapshot_to(_dest(tmp_path), "t")
    assert note is None
    with open(tmp_path / "store" / "unit" / "oom1" / "memory" / "rank0.snapshot.pickle", "rb") as f:
        actions = [e["action"] for e in pickle.load(f)["device_traces"][0]]
    assert actions == ["alloc", "oom"]  # taken at the OOM, not at the request
    assert {a.kind for a in artifacts} == {"memory_snapshot", "memory_view"}


def test_the_failing_thread_is_held_until_its_snapshot_is_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPROF_OOM_HOLD_S", "60")
    allocator = FakeAllocator()
    watch, reports = _watch(allocator)
    watch.record(True)
    raised = threading.Event()

    def training() -> None:
        try:
            allocator.oom(10 * MiB, device_free=0)
        except torch.OutOfMemoryError:
            raised.set()

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    for _ in range(2000):  # bounded: the report comes first, the error only after the store
        if reports:
            break
        thread.join(0.01)
    assert reports and not raised.is_set()
    watch.snapshot_to(_dest(tmp_path), "t")
    thread.join(30)
    assert raised.is_set()


def test_ooms_in_a_row_keep_one_snapshot_per_interval(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPROF_OOM_HOLD_S", "0")
    allocator, clock = FakeAllocator(), Clock()
    watch, reports = _watch(allocator, clock)
    watch.record(True)

    for _ in range(3):
        with pytest.raises(torch.OutOfMemoryError):
            allocator.oom(MiB, device_free=0)
        clock.now += 1
    assert len(reports) == 1
    watch.snapshot_to(_dest(tmp_path), "t")  # a bundle took the kept one
    clock.now += OOM_MIN_INTERVAL_S
    with pytest.raises(torch.OutOfMemoryError):
        allocator.oom(MiB, device_free=0)
    assert len(reports) == 2


def test_a_rank_asked_without_an_oom_stores_a_snapshot_taken_now(tmp_path):
    allocator = FakeAllocator()
    watch, _ = _watch(allocator)
    watch.record(True)
    allocator.alloc(7, 2 * MiB)

    artifacts, note = watch.snapshot_to(_dest(tmp_path), "t")

    assert note is None and [a.key for a in artifacts] == ["memory/rank0.snapshot.pickle", "memory/rank0.snapshot.html"]


def test_a_rank_that_records_nothing_says_why_instead_of_a_snapshot(tmp_path):
    watch, _ = _watch(FakeAllocator())

    artifacts, note = watch.snapshot_to(_dest(tmp_path), "t")

    assert artifacts == [] and "records no allocator history" in note


def test_a_window_snapshot_ends_without_stopping_the_watchs_recording(tmp_path):
    allocator = FakeAllocator()
    watch, _ = _watch(allocator)
    watch.record(True)
    events: list = []
    capture = Capture(_window(tmp_path, 3, 2), INFO, events.append, lambda: None, allocator=allocator)

    _train(capture, allocator, range(1, 8))

    assert events[-1].state.value == "DONE"
    assert allocator.recording  # the watch still records after the window's own stop
