"""Memory snapshots on demand: the window records the CUDA allocator over its steps and stores
each rank's snapshot and its page, with the allocator behind its seam (tests/support/fake_allocator.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.agent.capture import Capture
from actors.export.memory_view import read_device, render
from orchestrator.models.agent_protocol import StorageSpec, WindowSpec
from orchestrator.models.profile import RankEvent
from orchestrator.models.requests import ProfileRequest, RankState, TorchOptions
from tests.support.fake_allocator import FakeAllocator
from tests.unit.test_capture import INFO

MiB = 2**20


def _window(tmp_path: Path, start: int, steps: int) -> WindowSpec:
    return WindowSpec(
        profile_id="p1", target="unit", start_step=start, steps=steps, warmup=0,
        options=TorchOptions(memory_snapshot=True), storage=StorageSpec(uri=str(tmp_path / "store")),
        prefix="unit/p1", max_trace_bytes=10**9,
    )


def _train(capture: Capture, allocator: FakeAllocator, boundaries: range) -> None:
    """Each step allocates an activation of (step) MiB and frees it, and keeps a 1 MiB buffer per step."""
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in boundaries:
        allocator.alloc(1000 + step, step * MiB)
        model(torch.randn(4, 8)).sum().backward()
        allocator.free(1000 + step)
        allocator.alloc(step, MiB)
        opt.step()
        capture.on_boundary(step)
    if capture.finisher is not None:
        capture.finisher.join(60)


def _capture(tmp_path: Path, allocator: FakeAllocator, start: int = 3, steps: int = 2) -> tuple[list[RankEvent], Capture]:
    events: list[RankEvent] = []
    capture = Capture(_window(tmp_path, start, steps), INFO, events.append, lambda: None, allocator=allocator)
    return events, capture


def test_a_window_stores_each_ranks_snapshot_and_its_page_beside_the_trace(tmp_path):
    allocator = FakeAllocator()
    events, capture = _capture(tmp_path, allocator)
    _train(capture, allocator, range(1, 8))

    done = events[-1]
    assert done.state == RankState.DONE
    kinds = {a.kind: a.key for a in done.artifacts}
    assert kinds["memory_snapshot"] == "memory/rank0.snapshot.pickle"
    assert kinds["memory_view"] == "memory/rank0.snapshot.html"
    assert kinds["trace"].startswith("traces/")
    page = (tmp_path / "store" / "unit" / "p1" / "memory" / "rank0.snapshot.html").read_text()
    assert "CUDA memory of rank 0, profile p1, steps 3..4" in page
    assert "/job/train.py:42 train_step" in page  # the user's frame, not torch's
    assert "<script" not in page and "https://" not in page


def test_the_snapshot_holds_the_allocations_of_the_windows_steps_only(tmp_path):
    allocator = FakeAllocator()
    events, capture = _capture(tmp_path, allocator, start=3, steps=2)
    _train(capture, allocator, range(1, 8))

    with open(tmp_path / "store" / "unit" / "p1" / "memory" / "rank0.snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)
    sizes = [e["size"] // MiB for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    # Steps 3 and 4 run after boundaries 3 and 4 (Capture's numbering): their activations are 4 and 5 MiB.
    assert sizes == [4, 1, 5, 1]


def test_recording_stops_when_the_window_ends_and_its_history_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPROF_MEMORY_SNAPSHOT_MAX_ENTRIES", "3")
    allocator = FakeAllocator()
    _, capture = _capture(tmp_path, allocator)
    _train(capture, allocator, range(1, 8))

    assert (allocator.starts, allocator.stops, allocator.recording) == (1, 1, False)
    assert allocator.max_entries == 3


def test_a_cancelled_window_stops_recording_and_stores_no_snapshot(tmp_path):
    allocator = FakeAllocator()
    events, capture = _capture(tmp_path, allocator, start=2, steps=10)
    _train(capture, allocator, range(1, 4))
    capture.cancelled = True
    _train(capture, allocator, range(4, 5))

    assert events[-1].state == RankState.CANCELLED
    assert (allocator.recording, allocator.stops) == (False, 1)
    assert not (tmp_path / "store").exists()


def test_a_worker_without_cuda_fails_its_rank_with_the_reason_and_trains_on(tmp_path):
    allocator = FakeAllocator(unavailable="this worker has no CUDA device")
    events, capture = _capture(tmp_path, allocator)
    _train(capture, allocator, range(1, 8))

    assert [e.state for e in events] == [RankState.FAILED]
    assert "memory_snapshot asked for, but this worker has no CUDA device" in events[0].reason
    assert allocator.starts == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the real allocator's answer on a machine without CUDA")
def test_the_real_allocator_says_why_it_cannot_record_without_cuda():
    from actors.agent.cuda_memory import TorchAllocator

    assert "no CUDA device" in TorchAllocator().unavailable()


def test_the_option_reaches_the_window_but_not_torch_profiler():
    request = ProfileRequest(target="t", steps=2, memory_snapshot=True, profile_memory=True)

    options = request.torch_options()
    assert options.memory_snapshot
    assert "memory_snapshot" not in options.profiler_kwargs()
    assert options.profiler_kwargs()["profile_memory"] is True


def test_the_page_names_the_peak_the_largest_live_blocks_and_an_oom():
    frames = [{"filename": "/job/<model>.py", "line": 7, "name": "forward"}]
    snapshot = {
        "segments": [{"device": 0, "blocks": [{"size": 2 * MiB, "state": "active_allocated"}]}],
        "device_traces": [[
            {"action": "alloc", "addr": 1, "size": 8 * MiB, "time_us": 0, "frames": frames},
            {"action": "free_completed", "addr": 1, "size": 8 * MiB, "time_us": 10, "frames": frames},
            {"action": "oom", "addr": 0, "size": 64 * MiB, "device_free": 3 * MiB, "time_us": 20, "frames": frames},
        ]],
    }

    device = read_device(snapshot, 0)
    assert (device.baseline, device.peak) == (2 * MiB, 10 * MiB)
    assert [b.size for b in device.at_peak] == [8 * MiB]
    page = render(snapshot, "rank <0>")
    assert "asked for 64.0 MiB with 3.0 MiB free" in page
    assert "/job/&lt;model&gt;.py:7 forward" in page and "rank &lt;0&gt;" in page


_EVENTS = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "oom", "segment_alloc"]), st.integers(0, 7), st.integers(0, 2**40)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_EVENTS, st.integers(0, 2**40))
def test_any_recorded_history_renders_and_its_peak_bounds_every_point(ops, held_before):
    live: dict[int, int] = {}
    trace = []
    for action, addr, size in ops:
        if action == "free":
            if addr not in live:
                continue
            trace.append({"action": "free_completed", "addr": addr, "size": live.pop(addr)})
        elif action == "alloc" and addr not in live:
            live[addr] = size
            trace.append({"action": "alloc", "addr": addr, "size": size, "frames": []})
        elif action != "alloc":
            trace.append({"action": action, "addr": addr, "size": size})
    blocks = [{"size": s, "state": "active_allocated"} for s in [*live.values(), held_before]]
    snapshot = {"segments": [{"device": 0, "blocks": blocks}], "device_traces": [trace]}

    device = read_device(snapshot, 0)
    assert device.baseline == held_before
    assert all(device.baseline <= v <= device.peak for v in device.series)
    assert device.series[-1:] in ([], [sum(live.values()) + held_before])
    assert render(snapshot, "t").startswith("<!DOCTYPE html>")
