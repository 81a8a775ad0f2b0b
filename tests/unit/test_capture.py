"""One profiling window driven by step boundaries, without Ray."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest
import torch

from actors.agent.capture import Capture
from actors.agent.pace import Measure
from actors.agent.runtime import Agent
from orchestrator.models.agent_protocol import StorageSpec, WindowSpec, WorkerInfo
from orchestrator.models.pace import STEPS_BEFORE_METADATA_KEY, StepsBefore
from orchestrator.models.profile import RankEvent
from orchestrator.models.requests import RankState, TorchOptions
from tests.support.tracefiles import load_trace, profiler_steps

INFO = WorkerInfo(
    agent_id="a1", target="unit", world_rank=0, world_size=1, local_rank=0, node_rank=0,
    node_id="n", host="h", pid=1, device="cpu", torch_version=torch.__version__,
)


def _window(
    tmp_path: Path, start: int, steps: int, *, warmup: int = 0, max_trace_bytes: int = 10**9, **options
) -> WindowSpec:
    return WindowSpec(
        profile_id="p1", target="unit", start_step=start, steps=steps, warmup=warmup, options=TorchOptions(**options),
        storage=StorageSpec(uri=str(tmp_path / "store")), prefix="unit/p1",
        max_trace_bytes=max_trace_bytes,
    )


def _train(capture: Capture, boundaries: range) -> None:
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in boundaries:
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        capture.on_boundary(step)
    if capture.finisher is not None:
        capture.finisher.join(60)


def _run(tmp_path: Path, window: WindowSpec, boundaries: range) -> list[RankEvent]:
    events: list[RankEvent] = []
    _train(Capture(window, INFO, events.append, lambda: None), boundaries)
    return events


def test_trace_has_markers_for_exactly_the_window_steps(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=5, steps=3), range(1, 12))

    assert [e.state for e in events] == [RankState.CAPTURING, RankState.UPLOADING, RankState.DONE]
    done = events[-1]
    assert (done.first_step, done.last_step) == (5, 7)
    trace_path = tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz"
    assert profiler_steps(load_trace(trace_path)) == [5, 6, 7]
    assert {a.kind for a in done.artifacts} == {"trace", "op_table"}


def test_warmup_steps_are_not_in_the_window(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=6, steps=2, warmup=2), range(1, 12))

    assert (events[-1].first_step, events[-1].last_step) == (6, 7)


@pytest.mark.parametrize("warmup", [0, 1])
def test_the_agent_s_own_start_of_the_window_is_outside_its_first_step(tmp_path, warmup):
    # Starting the stack sampler's thread, the thread clock and the collector's watch took 1-2 ms of a busy host's
    # first step, which the report then read as the loop's own work before its batch (a checkpoint, an evaluation).
    events = _run(tmp_path, _window(tmp_path, start=3, steps=2, warmup=warmup, with_stack=True), range(1, 8))

    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    agent_calls = [e["name"] for e in spans if "actors/agent/" in e["name"]]
    assert [e.state for e in events] == [RankState.CAPTURING, RankState.UPLOADING, RankState.DONE]
    assert profiler_steps(trace) == [3, 4]
    assert any(e.get("cat") == "python_function" for e in spans)  # the Python calls are in the trace
    assert not [n for n in agent_calls if n.endswith((": _window_begins", ": start"))], agent_calls


def test_memory_timeline_is_written_when_memory_is_profiled(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=2, steps=2, profile_memory=True), range(1, 6))

    kinds = {a.kind for a in events[-1].artifacts}
    assert kinds == {"trace", "op_table", "memory_timeline"}


def test_window_whose_start_has_passed_fails_with_the_reason_and_says_it_missed_the_start(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=3, steps=2), range(5, 9))

    assert [e.state for e in events] == [RankState.FAILED]
    assert "had passed (rank was at step 5)" in events[0].reason
    assert events[0].missed_start


def test_trace_far_over_the_byte_cap_fails_and_uploads_nothing(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=2, steps=2, max_trace_bytes=100), range(1, 6))

    assert events[-1].state == RankState.FAILED
    assert "the cap of 100 bytes" in events[-1].reason and "nothing kept" in events[-1].reason
    assert events[-1].trace_bytes > 100
    assert not (tmp_path / "store" / "unit" / "p1" / "traces").exists()


def test_trace_over_the_byte_cap_keeps_the_steps_that_fit_and_says_so(tmp_path):
    full = _run(tmp_path / "full", _window(tmp_path / "full", start=2, steps=4), range(1, 8))[-1]
    cap = int(full.trace_bytes * 0.6)

    done = _run(tmp_path, _window(tmp_path, start=2, steps=4, max_trace_bytes=cap), range(1, 8))[-1]

    assert done.state == RankState.DONE
    assert done.first_step == 2 and 2 <= done.last_step < 5
    assert done.reason.startswith(f"trace cut to steps 2..{done.last_step} of 2..5")
    assert done.trace_bytes > cap
    trace_path = tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz"
    assert profiler_steps(load_trace(trace_path)) == list(range(2, done.last_step + 1))


def _profiler_of(capture: Capture, boundaries: range) -> weakref.ref:
    """Run ``boundaries`` with the cyclic collector off; the window's profiler, weakly."""
    _train(capture, boundaries[:1])
    assert capture._prof is not None
    return weakref.ref(capture._prof)


@pytest.mark.parametrize("cancel", [False, True], ids=["done", "cancelled"])
def test_the_windows_profiler_is_freed_at_its_close_without_the_cyclic_collector(tmp_path, cancel):
    # torch's profile is a reference cycle: left to the collector, its events were freed in a later step's
    # collection, read as the job's own pause.
    capture = Capture(_window(tmp_path, start=2, steps=2), INFO, lambda _: None, lambda: None)
    gc.collect()
    gc.disable()
    try:
        prof = _profiler_of(capture, range(2, 6))
        capture.cancelled = cancel
        _train(capture, range(3, 6))
        assert capture.closed and prof() is None
    finally:
        gc.enable()


def test_cancel_mid_window_stops_the_profiler_without_upload(tmp_path):
    events: list[RankEvent] = []
    capture = Capture(_window(tmp_path, start=2, steps=10), INFO, events.append, lambda: None)
    _train(capture, range(1, 4))
    capture.cancelled = True
    _train(capture, range(4, 5))

    assert [e.state for e in events] == [RankState.CAPTURING, RankState.CANCELLED]
    assert torch.autograd.profiler._is_profiler_enabled is False
    assert not (tmp_path / "store").exists()


def test_profiler_error_is_reported_and_training_continues(tmp_path):
    window = _window(tmp_path, start=2, steps=1, activities=["cuda"])
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    events = _run(tmp_path, window, range(1, 4))

    assert [e.state for e in events] == [RankState.FAILED]
    assert "no CUDA device" in events[0].reason


def test_idle_step_makes_no_calls():
    agent = Agent(INFO)  # never started: no thread, no controller
    calls: list[str] = []

    def tracer(frame, event, arg):
        if event in ("call", "c_call"):
            calls.append(f"{event}:{getattr(arg, '__name__', frame.f_code.co_name)}")

    step = agent.step
    sys.setprofile(tracer)
    for _ in range(100):
        step()
    sys.setprofile(None)

    # The step() frames themselves and nothing they call (the last entry is
    # the profiler being switched off).
    assert calls == ["call:step"] * 100 + ["c_call:setprofile"]
    assert agent.step_count == 100


def test_step_time_is_measured_over_at_least_a_second(monkeypatch):
    agent = Agent(INFO)
    clock = iter([100.0, 100.01, 101.5])
    monkeypatch.setattr("actors.agent.runtime.time.monotonic", lambda: next(clock))

    first = agent._heartbeat()
    agent.step_count = 1  # one step in 10 ms: too short a span to trust
    early = agent._heartbeat()
    agent.step_count = 30
    later = agent._heartbeat()

    assert first.step_time_s is None and early.step_time_s is None
    assert later.step_time_s == pytest.approx(1.5 / 30)


def test_an_armed_window_gets_the_agents_measure_of_the_steps_before_it(monkeypatch, tmp_path):
    agent = Agent(INFO)
    clock = iter([100.0, 102.0, 104.0])
    monkeypatch.setattr("actors.agent.runtime.time.monotonic", lambda: next(clock))
    agent._heartbeat()
    agent.step_count = 40
    agent._heartbeat()
    agent.step_count = 60

    agent._arm(_window(tmp_path, start=70, steps=2))

    assert agent.capture is not None
    assert agent.capture.before == Measure(steps=60, span_s=4.0, began=100.0)


def test_the_trace_carries_the_steps_before_the_window_and_the_options_that_cost_each_op(tmp_path):
    events: list[RankEvent] = []
    window = _window(tmp_path, start=3, steps=2, record_shapes=True, with_stack=True)
    _train(Capture(window, INFO, events.append, lambda: None, before=Measure(steps=40, span_s=2.0, began=1.0)), range(1, 7))

    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    assert events[-1].state is RankState.DONE
    seen = StepsBefore.model_validate(trace[STEPS_BEFORE_METADATA_KEY])
    assert seen == StepsBefore(step_ms=50.0, steps=40, span_s=2.0, options=["record_shapes", "with_stack"])


def test_a_window_armed_with_no_measure_of_the_steps_before_it_writes_none(tmp_path):
    events = _run(tmp_path, _window(tmp_path, start=3, steps=2), range(1, 7))

    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    assert events[-1].state is RankState.DONE
    assert STEPS_BEFORE_METADATA_KEY not in trace
