"""A job that runs DDP already is told DDP's own settings for its exposed all-reduce, never "use DDP": bucket
settings where its compute could hide the all-reduce, fewer bytes per sample where its collectives outlast that
compute (TraceLens' MI300 ResNet: 13.4 ms of collective kernels a step beside 4.3 ms of compute)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.comm_fix import comm_fix
from orchestrator.models.analysis import Finding, OpStat, PhaseTimes, RankSummary, StepBreakdown
from tests.support.realtraces import external, finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

_DDP_FORWARD = x_event("DistributedDataParallel.forward", 1, 100, cat="user_annotation")


def _all_reduce(ts: float, dur: float, corr: int) -> dict[str, Any]:
    return x_event(
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", ts, dur, cat="kernel", pid=0, tid=8,
        correlation=corr, stream=8, device=0, **{"Collective name": "allreduce"},
    )


def _exposed(tmp_path: Path, compute_until: float, ddp: bool) -> Finding:
    """A 1 ms step: compute from 5 µs to ``compute_until``, then an all-reduce from there to 900 µs that nothing
    overlaps; ``ddp``: the forward is DDP's."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        *([_DDP_FORWARD] if ddp else []),
        launch(0, 1, dur=2), kernel(5, compute_until - 5, 1),
        launch(3, 2, dur=2), _all_reduce(compute_until, 900 - compute_until, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "comm_exposed")


def test_a_ddp_job_whose_all_reduce_outlasts_its_compute_is_told_to_send_fewer_bytes(tmp_path: Path) -> None:
    found = _exposed(tmp_path, 300, ddp=True)
    assert found.fix.startswith(
        "DDP already all-reduces the gradients in buckets during backward, but its collectives take 0.6 ms a step and "
        "the compute kernels that could hide them 0.3 ms: no bucket size hides that."
    )
    assert "no_sync()" in found.fix and "bf16_compress_hook" in found.fix
    assert "bucket_cap_mb" not in found.fix and "use DDP" not in found.fix


def test_a_ddp_job_with_compute_to_hide_its_all_reduce_is_told_ddps_bucket_settings(tmp_path: Path) -> None:
    found = _exposed(tmp_path, 600, ddp=True)
    assert found.fix.startswith("DDP already all-reduces the gradients in buckets during backward; 0.3 ms a step of it stays exposed")
    assert "bucket_cap_mb" in found.fix and "static_graph=True" in found.fix and "use DDP" not in found.fix


def test_a_job_without_ddp_is_told_to_all_reduce_during_backward(tmp_path: Path) -> None:
    found = _exposed(tmp_path, 300, ddp=False)
    assert found.fix.startswith("Let gradient communication run during backward: use DDP/FSDP rather than an all_reduce")


def test_tracelens_mi300_ddp_resnet_is_told_its_collectives_outlast_its_compute() -> None:
    # Before: "use DDP/FSDP rather than an all_reduce after backward" to a job whose forward is DDP's.
    found = finding(external("tracelens_mi300_resnet_ckpt_r0of8"), "comm_exposed")
    assert found.fix.startswith(
        "DDP already all-reduces the gradients in buckets during backward, but its collectives take 13.4 ms a step and "
        "the compute kernels that could hide them 4.3 ms"
    )


def _cpu_step(tmp_path: Path, backward_us: float) -> Finding:
    """A CPU-only DDP step: forward, backward for ``backward_us``, then the host waits in gloo's all-reduce to 900 µs,
    inside the last gradient's AccumulateGrad node, where DDP's reducer launches and waits for it (tests/data/traces/
    cpu_ddp)."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), _DDP_FORWARD,
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 110, backward_us),
        x_event("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 110 + backward_us, 790 - backward_us),
        x_event("gloo:all_reduce", 110 + backward_us, 790 - backward_us),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "comm_exposed")


def test_on_a_cpu_a_ddp_wait_longer_than_backward_is_told_to_send_fewer_bytes(tmp_path: Path) -> None:
    found = _cpu_step(tmp_path, 200)
    assert found.fix.startswith("DDP already all-reduces the gradients in buckets during backward, but its collectives take 0.6 ms")
    assert "and the backward that could hide them 0.2 ms" in found.fix


def test_on_a_cpu_a_ddp_wait_shorter_than_backward_is_told_ddps_bucket_settings(tmp_path: Path) -> None:
    found = _cpu_step(tmp_path, 500)
    assert found.fix.startswith("DDP already all-reduces the gradients in buckets during backward; 0.3 ms a step of it stays exposed")


def _own(calls: int, own_ms: float, wait_ms: float, ddp: bool) -> RankSummary:
    """A CPU rank that waits ``wait_ms`` a step in collectives, ``own_ms`` of it in ``calls`` all-reduces of its own."""
    return RankSummary(
        rank=0, host="h", file="f", device="cpu", mean_step_ms=100.0, median_step_ms=100.0, ddp=ddp,
        mean_phases=PhaseTimes(comm=wait_ms, backward=10.0), comm_wait_ms=wait_ms,
        steps=[StepBreakdown(step=i, start_unix_us=0.0, duration_ms=100.0, phases=PhaseTimes()) for i in range(3)],
        comm_ops=[OpStat(name="c10d::allreduce_", calls=3 * (calls + 1), total_ms=1.0)],
        own_comm=OpStat(name="c10d::allreduce_", calls=3 * calls, total_ms=own_ms),
    )


def test_a_job_without_ddp_whose_own_calls_hold_the_wait_is_told_both_readings() -> None:
    fix = comm_fix(_own(8, 30.0, 40.0, ddp=False))
    assert fix.startswith("8 collective calls a step (c10d::allreduce_) run outside forward and backward and hold 30.0 ms")
    assert "if they average the gradients, DDP or FSDP reduces them in buckets during backward instead" in fix


def test_own_calls_holding_less_than_half_the_wait_leave_the_fix_to_the_lead_collective() -> None:
    fix = comm_fix(_own(8, 15.0, 40.0, ddp=True))
    assert fix.startswith("DDP already all-reduces the gradients in buckets during backward")


def _metric_on_device(tmp_path: Path, launcher_tid: int) -> Finding:
    """A DDP step on a device whose one exposed all-reduce (420-900 µs) is launched inside a c10d::allreduce_ after
    backward, on thread ``launcher_tid`` (1: the main thread, 2: the autograd engine's device thread)."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), _DDP_FORWARD,
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 110, 190, tid=2),
        launch(0, 1, dur=2), kernel(5, 395, 1),
        x_event("c10d::allreduce_", 400, 20, tid=launcher_tid), {**launch(405, 2, dur=2), "tid": launcher_tid},
        _all_reduce(420, 480, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "comm_exposed")


def test_an_all_reduce_the_main_thread_launches_after_backward_is_the_jobs_own_on_a_device_too(tmp_path: Path) -> None:
    fix = _metric_on_device(tmp_path, launcher_tid=1).fix
    assert fix.startswith("1 collective call a step (c10d::allreduce_) runs outside forward and backward and holds 0.5 ms")
    assert "DDP reduces the gradients during backward already" in fix


def test_an_all_reduce_the_autograd_thread_launches_is_ddps(tmp_path: Path) -> None:
    fix = _metric_on_device(tmp_path, launcher_tid=2).fix
    assert fix.startswith("DDP already all-reduces the gradients in buckets during backward")


def test_a_barrier_every_step_is_told_to_go(tmp_path: Path) -> None:
    # A CPU DDP step that ends in dist.barrier(): the host waits in gloo's barrier from 400 to 900 µs.
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), _DDP_FORWARD,
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 110, 280),
        x_event("c10d::barrier", 400, 500), x_event("gloo:barrier", 405, 495),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    fix = finding(analyze_folder(tmp_path), "comm_exposed").fix
    assert fix.startswith("1 barrier a step (c10d::barrier) outside forward and backward holds 0.5 ms of the 0.5 ms")
    assert "drop it from the loop" in fix


def test_a_device_busy_mostly_in_collectives_nothing_overlaps_is_not_called_gpu_bound() -> None:
    # TraceLens' MI300 ResNet rank: busy 95% of the step, 66% of it in collectives no compute overlaps. Before, a
    # second finding called it "GPU-bound: the device is busy 95%" under "Communication does not overlap computation".
    # (Its activation checkpointing's recomputation is an info line after it: test_analysis_recompute.py.)
    codes = [f.code for f in external("tracelens_mi300_resnet_ckpt_r0of8").findings]
    assert codes == ["comm_exposed", "activation_recompute"]


def test_a_busy_device_that_computes_over_half_the_step_stays_gpu_bound_beside_its_exposed_collective(tmp_path: Path) -> None:
    # Compute 5-600 µs and an all-reduce nothing overlaps 600-950 µs: busy 95%, computing 60%.
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1, dur=2), kernel(5, 595, 1), launch(3, 2, dur=2), _all_reduce(600, 350, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    assert "gpu_bound" in [f.code for f in analyze_folder(tmp_path).findings]


def test_a_busy_device_that_computes_under_half_the_step_is_not_gpu_bound(tmp_path: Path) -> None:
    # Compute 5-400 µs and an all-reduce nothing overlaps 400-950 µs: busy 95%, computing 40%.
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1, dur=2), kernel(5, 395, 1), launch(3, 2, dur=2), _all_reduce(400, 550, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    codes = [f.code for f in analyze_folder(tmp_path).findings]
    assert "gpu_bound" not in codes and "comm_exposed" in codes
