"""A step is analysed only where the profiler recorded (iterations.recorded_steps): an on-demand trace stops recording
mid-step and Kineto still writes the open ProfilerStep to its end, long after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.iterations import recorded_steps
from orchestrator.traces.loader import Span
from tests.support.tracefiles import write_trace, x_event

CUT = "the profiler recorded only part of a step"


def _recording(ts: float, dur: float) -> dict[str, Any]:
    return x_event("PyTorch Profiler (0)", ts, dur, cat="Trace", pid="Spans", tid="PyTorch Profiler")


def _two_steps(tmp_path: Path, *recording: dict[str, Any]) -> Any:
    """Two steps of an mm each; the second's span lasts 50 ms though its op ends 0.1 ms in (recording: 0-1.0 ms)."""
    events = [
        *recording,
        x_event("ProfilerStep#7", 0, 900, cat="user_annotation"), x_event("aten::mm", 10, 800),
        x_event("ProfilerStep#8", 900, 50_000, cat="user_annotation"), x_event("aten::mm", 910, 80),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_a_step_still_open_when_recording_stopped_is_analysed_to_the_recordings_end(tmp_path: Path) -> None:
    summary = _two_steps(tmp_path, _recording(0, 1000))
    steps = summary.ranks[0].steps
    assert [(s.step, round(s.duration_ms, 3)) for s in steps] == [(7, 0.9), (8, 0.1)]
    assert any(CUT in i and "step 8 has 49.9 ms outside the recording (0.1 ms recorded)" in i for i in summary.issues)


def test_a_trace_without_the_profilers_own_span_keeps_its_steps_whole(tmp_path: Path) -> None:
    summary = _two_steps(tmp_path)
    assert [round(s.duration_ms, 3) for s in summary.ranks[0].steps] == [0.9, 50.0]
    assert not any(CUT in i for i in summary.issues)


def test_steps_inside_the_recording_are_unchanged_and_nothing_is_said(tmp_path: Path) -> None:
    summary = _two_steps(tmp_path, _recording(-5, 60_000))
    assert [round(s.duration_ms, 3) for s in summary.ranks[0].steps] == [0.9, 50.0]
    assert not any(CUT in i for i in summary.issues)


def test_a_step_the_profiler_recorded_nothing_of_is_left_out_and_said(tmp_path: Path) -> None:
    summary = _two_steps(tmp_path, _recording(0, 850))
    assert [s.step for s in summary.ranks[0].steps] == [7]
    assert any("step 8 has 50.0 ms outside the recording (nothing recorded: left out)" in i for i in summary.issues)


def test_a_recording_span_that_holds_no_step_cuts_nothing(tmp_path: Path) -> None:
    # A damaged or foreign profiler span (zero length, or far from the steps) must not wipe the analysis.
    for recording in (_recording(0, 0), _recording(90_000, 1000), _recording(500, -400)):
        summary = _two_steps(tmp_path, recording)
        assert [round(s.duration_ms, 3) for s in summary.ranks[0].steps] == [0.9, 50.0]


def test_a_compiled_call_recorded_at_the_end_of_an_on_demand_trace_is_not_a_13_second_idle_step(tmp_path: Path) -> None:
    # Shaped after HTA's Triton example (tests/data/triton_example): the recording lasts 355 ms; ProfilerStep#1 opens
    # 1.7 ms before it ends and is written 13.3 s long. Before: "The device idles 13336.3 ms per step ... Python outside
    # any op 13335.0 ms", a warning to profile with_stack.
    kernel = 355_175
    events = [
        _recording(0, 355_494),
        x_event("ProfilerStep#1", 353_821, 13_336_316, cat="user_annotation", tid=2),
        x_event("Torch-Compiled Region: 0/0", 353_873, 1_353),
        x_event("triton_poi_fused_add_cos_sin_0", 355_085, 96),
        x_event("cuLaunchKernel", 355_130, 48, cat="cuda_driver", correlation=3),
        x_event("triton_poi_fused_add_cos_sin_0", kernel, 1.8, cat="kernel", pid=0, tid=7, correlation=3),
        x_event("cudaDeviceSynchronize", 355_335, 17, cat="cuda_runtime"),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    summary = analyze_folder(tmp_path)
    (step,) = summary.ranks[0].steps
    assert round(step.duration_ms, 2) == 1.67
    assert all("13336" not in f.evidence and "13335" not in f.evidence for f in summary.findings)


_spans = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)).map(lambda t: (min(t), max(t) + 1)), max_size=12
)


@given(_spans, st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)).map(lambda t: (min(t), max(t))))
def test_each_analysed_step_lies_in_its_span_and_the_recording_and_only_steps_with_nothing_recorded_go(
    spans: list[tuple[int, int]], recorded: tuple[int, int] | None
) -> None:
    steps = [Span(t0, t1, f"ProfilerStep#{i}", "user_annotation", 1, 1) for i, (t0, t1) in enumerate(spans)]
    windows, numbers, issue = recorded_steps(steps, recorded)
    inside = [i for i, (t0, t1) in enumerate(spans) if recorded is None or min(t1, recorded[1]) > max(t0, recorded[0])]
    if not inside:  # a recording that holds no step cuts nothing
        inside, recorded = list(range(len(spans))), None
    assert numbers == inside
    for (w0, w1), i in zip(windows, numbers, strict=True):
        t0, t1 = spans[i]
        assert t0 <= w0 < w1 <= t1
        assert recorded is None or recorded[0] <= w0 and w1 <= recorded[1]
    whole = all(w == spans[i] for w, i in zip(windows, numbers, strict=True)) and len(numbers) == len(spans)
    assert (issue is None) == whole
