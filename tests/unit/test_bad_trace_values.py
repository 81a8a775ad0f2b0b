"""Traces that claim what no run can be (a billion ranks, a 400-digit clock, a step numbered with 5,000
digits, a negative or 5,000-year span) are refused with a reason in the summary, never a traceback, and
never with memory or time that grows with the claim."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.analysis.front import analyze_folder
from orchestrator.traces.discover import discover_traces
from tests.support.tracefiles import write_trace, x_event


def _steps(step_s: float = 0.01, first: int = 0, n: int = 3) -> list[dict]:
    events = []
    for i in range(n):
        ts = i * step_s * 1e6
        events.append(x_event(f"ProfilerStep#{first + i}", ts, step_s * 1e6, cat="user_annotation"))
        events.append(x_event("aten::mm", ts + 10, step_s * 1e6 / 2))
    return events


def _folder(tmp_path: Path, bad: dict, bad_events: list[dict] | None = None, world_size: int = 2) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    write_trace(folder / "rank0.pt.trace.json", _steps(), rank=0, world_size=world_size, **bad)
    write_trace(folder / "rank1.pt.trace.json", bad_events or _steps(), rank=1, world_size=world_size)
    return folder


def test_a_world_size_of_a_trillion_is_reported_from_what_the_folder_holds(tmp_path):
    traces = discover_traces(_folder(tmp_path, {}, world_size=10**12))
    assert [tf.rank for tf in traces.files] == [0, 1]
    assert any("2-999999999999" in issue and "10^12" not in issue for issue in traces.issues), traces.issues


def test_a_400_digit_base_time_refuses_that_rank_with_a_reason(tmp_path):
    summary = analyze_folder(_folder(tmp_path, {"baseTimeNanoseconds": 10**400}))
    assert [r.rank for r in summary.ranks] == [1]
    assert [r.rank for r in summary.rejected] == [0] and "baseTimeNanoseconds" in summary.rejected[0].reason


def test_a_step_numbered_with_5000_digits_refuses_that_rank_with_a_reason(tmp_path):
    events = [x_event("ProfilerStep#" + "9" * 5000, 0, 1e4, cat="user_annotation"), *_steps()]
    summary = analyze_folder(_folder(tmp_path, {}, events))
    assert [r.rank for r in summary.ranks] == [0]
    assert "ProfilerStep#" in summary.rejected[0].reason and "digits" in summary.rejected[0].reason


def test_negative_and_impossibly_long_spans_are_refused_not_measured(tmp_path):
    for name, events in {
        "negative": [*_steps(), x_event("aten::mm", 100, -5e5)],
        "long step": [x_event("ProfilerStep#7", -9e16, 1.8e17, cat="user_annotation"), *_steps(first=8)],
    }.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        summary = analyze_folder(_folder(folder, {}, events))
        assert [r.rank for r in summary.ranks] == [0], name
        assert [r.rank for r in summary.rejected] == [1] and "span" in summary.rejected[0].reason, name


_HUGE_INTS = st.one_of(st.integers(), st.integers(min_value=10**18, max_value=10**500), st.integers(max_value=-(10**18)))
_NUMBERS = st.one_of(_HUGE_INTS, st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    world_size=_HUGE_INTS,
    base=_NUMBERS,
    digits=st.integers(min_value=1, max_value=6000),
    ts=_NUMBERS,
    dur=_NUMBERS,
)
def test_any_header_and_span_values_give_a_summary_never_a_traceback(tmp_path_factory, world_size, base, digits, ts, dur):
    folder = tmp_path_factory.mktemp("fuzz")
    doc = {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base,
        "distributedInfo": {"rank": 0, "world_size": world_size},
        "traceEvents": [*_steps(), x_event("ProfilerStep#" + "1" * digits, ts, dur, cat="user_annotation")],
    }
    (folder / "rank0.pt.trace.json").write_text(json.dumps(doc))
    summary = analyze_folder(folder)
    assert len(summary.ranks) + len(summary.rejected) == 1
    for rank in summary.ranks:
        for step in rank.steps:
            assert 0 <= step.duration_ms < 1e12
