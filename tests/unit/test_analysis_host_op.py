"""An op of the model that launches no device work and holds most of the host's time in the model's ops computes on
CPU tensors (advice.host_op): it is told to keep its input on the device or to leave the step, not the per-op
overhead's fixes (torch.compile, CUDA graphs, a larger batch). Shaped after TraceLens' MI300 OWLv2 pipeline (not
shared): torch.max over the detections' scores on the host, 40.4 of the 46.1 ms a step the model's ops idle the
device; before, "each op costs the host more than its kernels take on the device: torch.compile the model"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Summary
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

HOST = "aten::max runs on the host and launches no kernel while the device idles"


def _steps(tmp_path: Path, op: str, launches_inside: bool, frame: str | None = None) -> Summary:
    """Three 10 ms steps: a kernel to 1 ms, ``op`` 1-4 ms (holding a launch of a short kernel where
    ``launches_inside``; called in the Python ``frame`` where given), a small op, and a kernel from 4.5 ms on."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        o, c = 10_000 * i, 10 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 10_000, cat="user_annotation"),
            *([x_event(frame, o + 990, 3005, cat="python_function")] if frame else []),
            launch(o, c + 1), kernel(o, 1000, c + 1),
            x_event(op, o + 1000, 3000),
            *([launch(o + 3900, c + 2), kernel(o + 3950, 20, c + 2)] if launches_inside else []),
            x_event("aten::add", o + 4000, 400),
            launch(o + 4500, c + 3), kernel(o + 4505, 5495, c + 3),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def _fix(summary: Summary) -> str:
    return next(f.fix for f in summary.findings if f.code == "low_gpu_utilization")


def test_an_op_that_launches_nothing_and_leads_the_models_ops_is_told_to_keep_its_input_on_the_device(tmp_path: Path) -> None:
    fix = _fix(_steps(tmp_path, "aten::max", launches_inside=False))
    assert fix.startswith(HOST + " (3.0 ms per step in 1 call): it computes on CPU tensors.")
    assert "Keep its input on the device" in fix and "torch.compile" not in fix


def test_the_same_op_launching_its_kernel_is_told_the_per_op_overhead(tmp_path: Path) -> None:
    fix = _fix(_steps(tmp_path, "aten::max", launches_inside=True))
    assert HOST not in fix and "torch.compile" in fix


def test_an_allocation_that_launches_nothing_is_not_told_it_computes_on_the_host(tmp_path: Path) -> None:
    fix = _fix(_steps(tmp_path, "aten::empty", launches_inside=False))
    assert "runs on the host and launches no kernel" not in fix


def test_a_with_stack_trace_names_the_python_function_that_calls_the_host_op(tmp_path: Path) -> None:
    fix = _fix(_steps(tmp_path, "aten::max", launches_inside=False, frame="detect/postprocess.py(503): post_process"))
    assert fix.startswith(HOST + " (3.0 ms per step in 1 call, called in post_process (detect/postprocess.py:503)):")
