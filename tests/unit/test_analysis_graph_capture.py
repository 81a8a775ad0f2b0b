"""CUDA/HIP graph capture (issue 29): while the host records a graph its kernels do not run, so the device idles
by design. That time is its own idle cause (``capture``), told as warm-up, or as graphs recorded again when most
steps record. Before it, SGLang's capture trace was told to "keep the region 'capture_32_DECODE''s work on the
device", and Inductor's CUDA graph trees' recording to move 'CUDAGraphNode.record' off the step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.intervals import clip
from orchestrator.analysis.spans import by_kind, graph_captures
from orchestrator.models.analysis import Finding, Summary
from orchestrator.traces.loader import Span
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch


def capture_step(
    t0: float, *, corr: int, region: str | None = "capture_32_DECODE", kernel_end: float = 140, begin: float = 150
) -> list[dict[str, Any]]:
    """One 1,000 µs step from ``t0``: a kernel runs 0-140 µs; the host records a graph from 150 to 700 µs (its
    launches run nothing), instantiates it until 750 µs, and launches a kernel that runs 757-1000 µs."""
    events = [
        x_event(f"ProfilerStep#{corr}", t0, 1000, cat="user_annotation"),
        launch(t0, corr),
        kernel(t0, kernel_end, corr),
        x_event("cudaStreamBeginCapture", t0 + begin, 2, cat="cuda_runtime"),
        x_event("aten::mm", t0 + begin + 10, 400),
        x_event("cudaLaunchKernel", t0 + begin + 20, 5, cat="cuda_runtime", correlation=corr + 500),
        x_event("cudaStreamEndCapture", t0 + 690, 10, cat="cuda_runtime"),
        x_event("cudaGraphInstantiateWithFlags", t0 + 700, 50, cat="cuda_runtime"),
        launch(t0 + 750, corr + 1000),
        kernel(t0 + 757, 243, corr + 1000),
    ]
    if region is not None:
        events.append(x_event(region, t0 + 140, 620, cat="user_annotation"))
    return events


def analyse(tmp_path: Path, events: list[dict[str, Any]]) -> Summary:
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def low_utilization(summary: Summary) -> Finding:
    return next(f for f in summary.findings if f.code == "low_gpu_utilization")


def test_device_idle_while_the_host_records_a_graph_is_capture_time(tmp_path: Path) -> None:
    (rank,) = analyse(tmp_path, capture_step(0, corr=1)).ranks
    assert rank.idle is not None
    capture = rank.idle.get("capture")
    # From BeginCapture (150 µs) to the end of the graph's instantiation (750 µs).
    assert capture is not None and capture.ms_per_step == pytest.approx(0.6)
    cpu = rank.idle.get("cpu")
    assert cpu is None or "aten::mm" not in {o.name for o in cpu.top}  # recorded into the graph: no host op to fix


def test_torch_cuda_graphs_own_set_up_around_a_capture_is_capture_time(tmp_path: Path) -> None:
    # torch.cuda.graph's __enter__ syncs, collects garbage and empties the cache before capture_begin (vLLM's
    # piecewise capture: 120 ms over 25 graphs); with stacks recorded it is the capture's cost too.
    set_up = x_event("torch/cuda/graphs.py(240): __enter__", 100, 202, cat="python_function")
    events = [*capture_step(0, corr=1, region=None, kernel_end=100, begin=300), set_up]
    (rank,) = analyse(tmp_path, events).ranks
    assert rank.idle is not None and rank.idle.ms("capture") == pytest.approx(0.65)  # 100-750 µs, not 300-750


def test_a_capture_is_told_as_warm_up_not_as_its_region(tmp_path: Path) -> None:
    low = low_utilization(analyse(tmp_path, capture_step(0, corr=1)))
    assert low.fix.startswith("The host records CUDA/HIP graphs while the device idles (0.6 ms per step)")
    assert "Profile steps after it" in low.fix
    assert "capture_32_DECODE" not in low.fix
    # What is left besides the capture (140-150 µs, 750-757 µs of Python and launch) is too little to warn about.
    assert low.severity == "info"


def test_graphs_recorded_again_in_most_steps_are_told_to_keep_shapes_fixed(tmp_path: Path) -> None:
    events = [e for i in range(3) for e in capture_step(i * 1000, corr=i + 1, region=None)]
    low = low_utilization(analyse(tmp_path, events))
    assert low.fix.startswith("The host records CUDA/HIP graphs in 3 of 3 steps while the device idles")
    assert "TORCH_LOGS=cudagraphs" in low.fix
    assert low.severity == "warning"


def test_a_graph_recorded_in_one_step_of_three_is_warm_up(tmp_path: Path) -> None:
    replay = [
        e for i in (1, 2) for e in (
            x_event(f"ProfilerStep#{i + 1}", i * 1000, 1000, cat="user_annotation"),
            launch(i * 1000, i + 1),
            kernel(i * 1000 + 6, 990, i + 1),
        )
    ]
    low = low_utilization(analyse(tmp_path, [*capture_step(0, corr=1, region=None), *replay]))
    assert low.fix.startswith("The host records CUDA/HIP graphs while the device idles")
    assert "TORCH_LOGS" not in low.fix


def test_a_capture_that_never_ends_in_the_trace_lasts_to_the_threads_last_span(tmp_path: Path) -> None:
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1),
        kernel(0, 100, 1),
        x_event("cudaStreamBeginCapture", 200, 2, cat="cuda_runtime"),
        x_event("aten::mm", 210, 600),
    ]
    (rank,) = analyse(tmp_path, events).ranks
    assert rank.idle is not None and rank.idle.ms("capture") == pytest.approx(0.8)


_CALLS = st.sampled_from(["cudaStreamBeginCapture", "hipStreamBeginCapture", "cudaStreamEndCapture", "hipStreamEndCapture",
                          "cudaGraphInstantiate", "cudaLaunchKernel"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_CALLS, st.integers(0, 10_000), st.integers(0, 500)), max_size=30))
def test_captures_are_sorted_disjoint_and_hold_every_begin_to_its_next_end(calls: list[tuple[str, int, int]]) -> None:
    # Any order a trace can hold them in: concurrent captures on two streams, an end with no begin, a begin never ended.
    spans = sorted((Span(float(ts), float(ts + dur), name, "cuda_runtime", 1, 1) for name, ts, dur in calls), key=lambda s: (s.ts, -s.end))
    got = graph_captures(by_kind(spans))
    assert all(a < b for a, b in got) and all(got[i][1] < got[i + 1][0] for i in range(len(got) - 1))
    last = max((s.end for s in spans), default=0.0)
    ends = sorted(s.end for s in spans if "EndCapture" in s.name)
    for begin in (s.ts for s in spans if "BeginCapture" in s.name):
        end = next((e for e in ends if e > begin), last)
        if end > begin:
            assert clip(got, begin, end) == [(begin, end)]


def test_the_saving_leaves_out_the_capture_no_later_step_pays(tmp_path: Path) -> None:
    # SGLang's capture trace claimed "saves at most 33.7 ms (100%)" of a step that only records graphs.
    low = low_utilization(analyse(tmp_path, capture_step(0, corr=1)))
    assert low.max_saving_ms == pytest.approx(0.017, abs=0.001)  # 140-150 µs and 750-757 µs
    assert "The saving leaves out CUDA/HIP graph capture (0.6 ms per step): later steps do not pay it." in low.evidence
