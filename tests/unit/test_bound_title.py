"""A device busy nearly all the step is told so by the name of what the trace recorded: an MTIA is no GPU (HTA's
MTIA inference trace was titled "GPU-bound")."""

from __future__ import annotations

from pathlib import Path

from orchestrator.analysis import analyze_folder
from tests.support.tracefiles import write_trace, x_event


def test_a_busy_mtia_is_called_mtia_bound_not_gpu_bound(tmp_path: Path) -> None:
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("aten::linear", 0, 20),
        x_event("launchKernel", 5, 10, cat="mtia_runtime"),
        x_event("fc-dtype_Float", 20, 960, cat="mtia_ccp_events", pid=17, tid=3001, stream=1),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    titles = [f.title for f in analyze_folder(tmp_path).findings if f.code == "gpu_bound"]
    assert titles == ["MTIA-bound: the device is busy 96% of the step"]
