"""Every idle gap is attributed once, whatever the trace holds (Hypothesis): kernels launched before, inside or long
before their gap, host ops, syncs, DataLoader waits, graph captures and compilations overlapping in any way. The
causes of each step add up to the step's idle time, none is negative, and each is a known cause."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import IDLE_CAUSES
from tests.support.tracefiles import write_trace, x_event

_HOST = st.sampled_from([
    ("aten::mm", "cpu_op"), ("aten::item", "cpu_op"), ("cudaStreamSynchronize", "cuda_runtime"),
    ("cudaMalloc", "cuda_runtime"), ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation"),
    ("cudaStreamBeginCapture", "cuda_runtime"), ("cudaStreamEndCapture", "cuda_runtime"),
    ("_compile.compile_inner (dynamo_timed)", "cpu_op"), ("MASK INDICES", "user_annotation"),
    ("Optimizer.step#AdamW.step", "user_annotation"),
])
_TIME = st.integers(0, 3000)


@st.composite
def traces(draw: st.DrawFn) -> list[dict[str, Any]]:
    events = [x_event(f"ProfilerStep#{i + 1}", i * 1000, 1000, cat="user_annotation") for i in range(3)]
    for name, cat in draw(st.lists(_HOST, max_size=12)):
        events.append(x_event(name, draw(_TIME), draw(st.integers(1, 600)), cat=cat))
    for corr in range(1, draw(st.integers(1, 10)) + 1):
        called, call = draw(_TIME), draw(st.integers(1, 80))
        start = called + draw(st.integers(-20, 900))  # clock skew, at once, or long after: queued
        events.append(x_event("cudaLaunchKernel", called, call, cat="cuda_runtime", correlation=corr))
        events.append(x_event("kernel", max(start, 0), draw(st.integers(1, 400)), cat="kernel", pid=0, tid=7,
                              correlation=corr, stream=7, device=0))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_the_causes_of_each_step_add_up_to_its_idle_time(events: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_trace(Path(tmp) / "rank0.pt.trace.json", events, world_size=1)
        (rank,) = analyze_folder(Path(tmp)).ranks
    for step in rank.steps:
        assert set(step.idle_ms) <= set(IDLE_CAUSES) and all(ms > 0 for ms in step.idle_ms.values())
        assert sum(step.idle_ms.values()) == pytest.approx(step.duration_ms - (step.gpu_busy_ms or 0.0), abs=1e-6)
