"""Idle causes completed (issue 29): the drain after a sync, CUDA/HIP runtime calls, and the regions the host
is in while the device idles, each on a small trace shaped like the real ones (a ProfilerStep on the main
thread, kernels whose launches carry their correlation ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import RankSummary
from tests.support.tracefiles import write_trace, x_event


def kernel(ts: float, dur: float, corr: int, name: str = "volta_sgemm_128x64_nn") -> dict[str, Any]:
    return x_event(name, ts, dur, cat="kernel", pid=0, tid=7, correlation=corr, stream=7, device=0)


def launch(ts: float, corr: int, dur: float = 5) -> dict[str, Any]:
    return x_event("cudaLaunchKernel", ts, dur, cat="cuda_runtime", correlation=corr)


def launching(name: str, t: float, host: float, device: float, correlation: int) -> list[dict[str, Any]]:
    """An op of ``host`` µs at ``t`` whose launch runs a kernel of ``device`` µs (a small elementwise one under 10 µs)."""
    return [
        x_event(name, t, host),
        x_event("cudaLaunchKernel", t + host / 4, host / 4, cat="cuda_runtime", correlation=correlation),
        kernel(t + host / 2, device, correlation, name="elementwise_kernel" if device < 10 else "volta_sgemm_128x64_nn"),
    ]


def analyse(tmp_path: Path, events: list[dict[str, Any]]) -> RankSummary:
    write_trace(tmp_path / "rank0.pt.trace.json", [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), *events], world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.idle is not None
    return rank


def idle(rank: RankSummary) -> dict[str, float]:
    return {c.cause: round(c.ms_per_step * 1000, 3) for c in rank.idle.causes}  # µs


def item_then_relaunch(sync_from: float) -> list[dict[str, Any]]:
    """A kernel runs 0-400 µs; the host reads loss.item() from ``sync_from`` until it ends, then runs an op
    (410-590 µs) and launches the next kernel, which runs 605-1000 µs."""
    return [
        launch(0, 1),
        kernel(0, 400, 1),
        x_event("aten::item", sync_from, 400 - sync_from),
        x_event("cudaStreamSynchronize", sync_from + 2, 400 - sync_from - 3, cat="cuda_runtime"),
        x_event("aten::add", 410, 190),
        launch(590, 2),
        kernel(605, 395, 2),
    ]


def test_the_gap_after_a_sync_that_waited_out_queued_work_is_the_syncs(tmp_path: Path) -> None:
    # The host waited 380 µs for queued work: the 205 µs the device then idles while the host launches anew
    # would not exist without the wait. Before the drain rule: 190 µs cpu + 15 µs launch.
    rank = analyse(tmp_path, item_then_relaunch(20))
    assert idle(rank) == {"sync": pytest.approx(205, abs=0.01)}


def test_a_drain_is_bounded_by_the_work_the_sync_waited_out(tmp_path: Path) -> None:
    # The read waited only 50 µs of queued work: only that much of the gap after it is the sync's.
    rank = analyse(tmp_path, item_then_relaunch(350))
    got = idle(rank)
    assert got["sync"] == pytest.approx(50, abs=1.5)
    assert got["cpu"] + got.get("launch", 0) == pytest.approx(155, abs=1.5)


def test_the_dataloader_after_a_sync_stays_the_dataloaders(tmp_path: Path) -> None:
    events = item_then_relaunch(20)
    events[4] = x_event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 410, 180, cat="user_annotation")
    got = idle(analyse(tmp_path, events))
    assert got["data"] == pytest.approx(180, abs=0.01) and got["sync"] == pytest.approx(25, abs=0.01)


def test_runtime_calls_are_their_own_cause_named_by_the_call(tmp_path: Path) -> None:
    # The device idles while the host frees and allocates memory through the runtime, then runs an op.
    events = [
        launch(0, 1),
        kernel(0, 100, 1),
        x_event("aten::empty", 110, 400),
        x_event("cudaFree", 120, 200, cat="cuda_runtime"),
        x_event("cudaMalloc", 330, 100, cat="cuda_runtime"),
        x_event("aten::relu", 510, 80),
        launch(590, 2),
        kernel(600, 400, 2),
    ]
    rank = analyse(tmp_path, events)
    got = idle(rank)
    assert got["runtime"] == pytest.approx(300, abs=0.01)
    assert [(o.name, round(o.total_ms * 1000)) for o in rank.idle.get("runtime").top] == [("cudaFree", 200), ("cudaMalloc", 100)]
    assert "cudaFree" not in [o.name for o in rank.idle.get("cpu").top]


def test_cpu_idle_names_the_optimizer_step_or_region_it_falls_in(tmp_path: Path) -> None:
    events = [
        launch(0, 1),
        kernel(0, 100, 1),
        x_event("Optimizer.step#SGD.step", 100, 300, cat="user_annotation"),
        x_event("aten::add_", 110, 280),
        x_event("MASK INDICES", 400, 150, cat="user_annotation"),
        x_event("aten::nonzero", 410, 130),
        launch(590, 2),
        kernel(600, 400, 2),
    ]
    cpu = analyse(tmp_path, events).idle.get("cpu")
    assert [(o.name, round(o.total_ms * 1000)) for o in cpu.regions] == [("Optimizer.step#SGD.step", 300), ("MASK INDICES", 150)]


def test_a_kernel_that_starts_long_after_its_launch_returned_waited_on_a_dependency(tmp_path: Path) -> None:
    # SGLang's decode trace: a kernel launched as the one before it ends runs 463 ms later (behind a
    # hipStreamWaitEvent). Its launch returned 1 µs into the gap, so the whole gap was "launch-bound"; the device
    # starts a launched kernel within LAUNCH_GAP_US (2-4 µs at p99 in the real traces), the rest is queued.
    events = [
        launch(0, 1), kernel(0, 100, 1),
        launch(95, 2, dur=6), kernel(900, 100, 2),
    ]
    got = idle(analyse(tmp_path, events))
    assert got == {"launch": pytest.approx(51, abs=0.01), "queued": pytest.approx(749, abs=0.01)}


def test_a_gap_between_a_replayed_graphs_nodes_is_queued_work_named_by_the_graph_launch(tmp_path: Path) -> None:
    # A graph's nodes share its cudaGraphLaunch's correlation id: the device idles between two of them 600 µs.
    events = [
        x_event("cudaGraphLaunch", 0, 5, cat="cuda_runtime", correlation=1), kernel(10, 90, 1), kernel(700, 290, 1),
    ]
    queued = analyse(tmp_path, events).idle.get("queued")
    assert queued is not None and [(o.name, round(o.total_ms * 1000)) for o in queued.top] == [("cudaGraphLaunch", 600)]


def _fixes_when_queued_work_waits(tmp_path: Path, call: str) -> str:
    """Every finding's fix when two kernels ``call`` launched at the step's start run 600 µs apart."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event(call, 0, 5, cat="cuda_runtime", correlation=1), kernel(10, 90, 1),
        x_event(call, 6, 5, cat="cuda_runtime", correlation=2), kernel(700, 290, 2 if call == "cudaLaunchKernel" else 1),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return " ".join(f.fix for f in analyze_folder(tmp_path).findings)


def test_queued_work_launched_by_kernel_launches_keeps_the_cross_stream_advice(tmp_path: Path) -> None:
    fix = _fixes_when_queued_work_waits(tmp_path, "cudaLaunchKernel")
    assert "look for cross-stream waits" in fix and "_init_for_cuda_graphs" not in fix


def test_a_graph_replay_that_idles_between_its_nodes_is_told_the_profilers_blind_spot(tmp_path: Path) -> None:
    fix = _fixes_when_queued_work_waits(tmp_path, "hipGraphLaunch")
    assert "0.6 ms of it in replays of CUDA/HIP graphs" in fix and "_init_for_cuda_graphs()" in fix
