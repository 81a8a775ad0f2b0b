"""MTIA's command processor records a stream's wait for another stream (``event_wait``) and its event records
as events of their own, beside the kernels. A stream standing still is not work: the device's busy time and its
top kernels leave them out, as CUDA's device-side syncs are (a real MTIA inference trace of HTA's had
``event_wait`` as the second "kernel", 67% of the step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import RankSummary
from tests.support.tracefiles import write_trace, x_event


def device(name: str, ts: float, dur: float, stream: int) -> dict[str, Any]:
    return x_event(name, ts, dur, cat="mtia_ccp_events", pid=17, tid=3000 + stream, stream=stream)


def analyse(tmp_path: Path) -> RankSummary:
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("aten::linear", 0, 20),
        x_event("launchKernel", 5, 10, cat="mtia_runtime"),
        device("fc-dtype_Float", 20, 280, stream=1),
        device("event_record", 300, 1, stream=1),
        # Stream 2 waits 300-900 µs for stream 1's event while nothing else runs.
        device("event_wait", 300, 600, stream=2),
        device("fc-dtype_Float", 900, 100, stream=2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    return rank


def test_a_streams_event_wait_is_not_device_busy_time(tmp_path: Path) -> None:
    rank = analyse(tmp_path)
    assert rank.device == "mtia"
    assert rank.gpu is not None
    assert rank.gpu.busy_ms_per_step == pytest.approx(0.38, abs=0.001)


def test_event_waits_and_records_are_not_among_the_top_kernels(tmp_path: Path) -> None:
    assert [k.name for k in analyse(tmp_path).top_kernels] == ["fc-dtype_Float"]
