"""The agent's watch of Python's garbage collections over a window, and how it reaches the trace."""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from actors.agent import gc_watch
from actors.agent.capture import Capture
from actors.agent.frame_sampler import FrameSampler
from actors.agent.gc_watch import GcWatch
from orchestrator.models.gc_pauses import GC_METADATA_KEY, GcPauses
from tests.support.tracefiles import load_trace
from tests.unit.test_capture import INFO, _window


@pytest.fixture
def heap() -> Iterator[list[dict[str, list[int]]]]:
    """Enough container objects that a full collection takes over the recording threshold on any machine."""
    objects = [{"tokens": [i]} for i in range(300_000)]
    yield objects
    del objects


def _watched(work, watch: GcWatch | None = None) -> GcPauses:
    watch = watch or GcWatch(threading.get_ident(), 100)
    watch.start()
    try:
        work()
    finally:
        seen = watch.stop()
    return seen


def _collect_in_the_loop() -> None:
    gc.collect()


def test_a_gc_collect_call_is_recorded_as_explicit_with_its_calling_line(heap):
    seen = _watched(_collect_in_the_loop)
    (full,) = [c for c in seen.collections if c.generation == 2]
    assert full.explicit and full.training_thread
    assert full.caller is not None and full.caller.endswith("): _collect_in_the_loop")
    assert "test_gc_watch.py(" in full.caller


def test_a_collection_records_its_time_by_the_clock_and_its_threads_cpu_time():
    # Each callback reads both clocks once: start, then stop. 40 ms went by, 0.25 ms of them on a CPU.
    wall, cpu = iter([0, 40_000_000]), iter([1_000_000, 1_250_000])
    watch = GcWatch(threading.get_ident(), 100, clock_ns=lambda: next(wall), cpu_clock_ns=lambda: next(cpu))
    seen = _watched(functools.partial(gc.collect, 0), watch)
    (collection,) = seen.collections
    assert (collection.ms, collection.cpu_ms, collection.pause_ms) == (40.0, 0.25, 0.25)


def test_a_real_full_collection_records_a_cpu_time_within_its_clock_time(heap):
    (full,) = [c for c in _watched(_collect_in_the_loop).collections if c.generation == 2]
    assert full.cpu_ms is not None and 0 < full.cpu_ms <= full.ms


def test_the_collectors_own_collections_are_not_explicit_and_name_no_line(monkeypatch):
    monkeypatch.setattr(gc_watch, "MIN_RECORDED_MS", 0.0)  # record the young generation's short ones too
    gc.collect()  # from a known state: the young generation empty
    seen = _watched(lambda: [[] for _ in range(200_000)])
    assert len(seen.collections) >= 1 and sum(t.count for t in seen.totals if t.generation == 0) >= 1
    assert all(not c.explicit and c.caller is None for c in seen.collections)


def test_a_collection_with_automatic_collection_off_is_explicit(heap):
    gc.disable()
    try:
        seen = _watched(_collect_in_the_loop)
    finally:
        gc.enable()
    assert not seen.enabled
    assert any(c.explicit and c.generation == 2 for c in seen.collections)


def test_a_collection_on_another_thread_is_not_the_training_threads(heap):
    def elsewhere() -> None:
        thread = threading.Thread(target=gc.collect)
        thread.start()
        thread.join(timeout=60)

    seen = _watched(elsewhere)
    (full,) = [c for c in seen.collections if c.generation == 2]
    assert not full.training_thread


def test_it_records_at_most_its_cap_and_says_so_while_the_totals_go_on(heap):
    seen = _watched(lambda: [gc.collect() for _ in range(2)], GcWatch(threading.get_ident(), 1))
    assert len(seen.collections) == 1 and seen.truncated
    assert next(t for t in seen.totals if t.generation == 2).count == 2


def test_outside_a_window_the_collector_calls_nothing_of_the_agents():
    before = list(gc.callbacks)
    watch = GcWatch(threading.get_ident(), 10)
    watch.start()
    assert len(gc.callbacks) == len(before) + 1
    watch.stop()
    assert gc.callbacks == before


def test_a_watch_whose_clock_fails_stops_recording_and_never_raises_into_the_job():
    calls = []

    def broken_clock() -> int:
        calls.append(1)
        raise RuntimeError("clock gone")

    seen = _watched(lambda: [gc.collect() for _ in range(2)], GcWatch(threading.get_ident(), 10, clock_ns=broken_clock))
    assert len(calls) == 1 and seen.collections == [] and seen.totals == []


def test_it_says_whether_objects_were_frozen_out_of_the_walk():
    gc.freeze()
    try:
        seen = _watched(lambda: None)
    finally:
        gc.unfreeze()
    assert seen.frozen > 0 and seen.thresholds == gc.get_threshold()


def test_the_window_writes_its_collections_into_the_trace(tmp_path):
    capture = Capture(_window(tmp_path, start=2, steps=2), INFO, lambda e: None, lambda: None)
    model = torch.nn.Linear(8, 2)
    for step in range(1, 6):
        model(torch.randn(4, 8)).sum().backward()
        gc.collect()  # in every step: the window's two hold two full collections
        capture.on_boundary(step)
    assert capture.finisher is not None
    capture.finisher.join(60)
    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    seen = GcPauses.model_validate(trace[GC_METADATA_KEY])
    assert next(t for t in seen.totals if t.generation == 2).count >= 2


def test_a_stack_sample_taken_in_the_watchs_callback_names_the_line_that_collected(heap):
    # In a Ray worker the sampler waits for the GIL through a collection and lands in the callback as it ends. Here
    # the callback's clock is a C-level sleep (no Python frame of its own), so samples land in the callback itself.
    sampler = FrameSampler(threading.get_ident(), 0.01, 100)
    watch = GcWatch(threading.get_ident(), 10, clock_ns=functools.partial(time.sleep, 0.5))  # type: ignore[arg-type]
    sampler.start()
    watch.start()
    try:
        _collect_in_the_loop()
    finally:
        watch.stop()
        samples = sampler.stop()
    assert samples is not None
    innermost = {samples.stacks[i][0] for _, i in samples.samples}
    assert all(not name.startswith("actors/agent/") for name in innermost), innermost
    assert any(name.endswith("): _collect_in_the_loop") for name in innermost), innermost
