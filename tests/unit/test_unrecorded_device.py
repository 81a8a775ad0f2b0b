"""A trace of a GPU job whose device activity was not recorded (the CUDA runtime calls are there, no kernel or
copy is: CUPTI's range profiler, as in HTA's cupti_profiler trace, or device tracing that was off or failed) is
not called CPU-only: its waits for the device are not cheap, only unmeasured."""

from __future__ import annotations

from pathlib import Path

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Finding
from tests.support.tracefiles import write_trace, x_event


def host_sync(tmp_path: Path, *, runtime_calls: bool) -> Finding:
    """A step whose loss.item() waits 480 µs; with ``runtime_calls``, as a GPU job's trace holds them."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("aten::mm", 10, 300),
        x_event("aten::item", 400, 500),
        x_event("aten::_local_scalar_dense", 405, 490),
    ]
    if runtime_calls:
        events += [
            x_event("cudaLaunchKernel", 20, 10, cat="cuda_runtime", correlation=1),
            x_event("cudaMemcpyAsync", 410, 480, cat="cuda_runtime", correlation=2),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    (finding,) = [f for f in analyze_folder(tmp_path).findings if f.code == "host_sync"]
    return finding


def test_a_gpu_jobs_trace_without_device_activity_is_not_called_cpu_only(tmp_path: Path) -> None:
    evidence = host_sync(tmp_path, runtime_calls=True).evidence
    assert "CPU-only" not in evidence
    assert "The trace holds CUDA runtime calls but no device activity" in evidence


def test_a_cpu_only_trace_is_still_called_cpu_only(tmp_path: Path) -> None:
    assert "CPU-only" in host_sync(tmp_path, runtime_calls=False).evidence
