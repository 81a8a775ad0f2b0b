"""Autograd's anomaly detection left on in a training loop, told from the NaN check the engine runs after every
backward node (orchestrator.analysis.anomaly).

Recorded by tests/data/record_cpu_debug.py: cpu_anomaly is two gloo ranks of a six-block MLP under DDP with
torch.autograd.set_detect_anomaly(True) (before: an info line, "The host waits for a device value every step", 35
waits per step of aten::item, "To see which Python line reads, profile with with_stack=True"); cpu_anomaly_off is the
same loop without it, cpu_anomaly_rank0 with it on rank 0 alone (before: "Rank 0 is a straggler (backward)", "Find
what differs on that rank: compare its backward spans"); cpu_lightning_anomaly is Lightning's Trainer(detect_anomaly=True) under DDP; cpu_anomaly_stack a
with_stack recording under torch.autograd.detect_anomaly().
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.anomaly import anomaly_mode, nan_checks
from orchestrator.analysis.finding_base import verdict
from orchestrator.analysis.spans import by_kind
from orchestrator.models.analysis import Finding, Summary
from orchestrator.traces.loader import Span
from tests.support.tracefiles import case, write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel

NODE = "autograd::engine::evaluate_function: AddmmBackward0"


def anomaly(summary: Summary) -> Finding | None:
    return next((f for f in summary.findings if f.code == "anomaly_mode"), None)


def test_a_loop_under_set_detect_anomaly_is_told_to_turn_it_off_first():
    summary = analyze_folder(case("cpu_anomaly"))
    found = summary.findings[0]
    assert found.code == "anomaly_mode" and found.severity == "warning" and found.ranks == [0, 1]
    assert found.title == (
        "Autograd's anomaly detection is on: backward checks every gradient for NaN, 35 times a step"
    )
    assert "aten::isnan, aten::_is_any_true and a read of the answer, aten::item" in found.evidence
    assert found.fix.startswith("Turn anomaly detection off for training: remove torch.autograd.set_detect_anomaly(True)")
    assert verdict(summary).startswith("1 warning; the largest: Autograd's anomaly detection is on")


def test_every_step_counts_one_check_per_backward_node_output():
    summary = analyze_folder(case("cpu_anomaly"))
    for rank in summary.ranks:
        # Each defined output of each node: seven AddmmBackward0 (bias, input and weight; the first layer's input
        # needs none: 20), seven TBackward0, six ReluBackward0 and the loss's two: 35 a step on every rank.
        assert {s.anomaly.checks for s in rank.steps if s.anomaly} == {35}
        assert all(s.anomaly is not None and s.anomaly.check_ms > 0 for s in rank.steps)


def test_turning_it_off_saves_at_least_the_figure_the_finding_gives():
    on, off = analyze_folder(case("cpu_anomaly")), analyze_folder(case("cpu_anomaly_off"))
    found = anomaly(on)
    assert found is not None and found.saving_floor
    assert "Fixing it saves at least" in found.evidence and "saves at least" in verdict(on)
    # The same loop, recorded without it: its steps are shorter by more than the figure (forward's tracebacks are
    # partly inside its ops, which the trace does not separate).
    saved = statistics.fmean(r.mean_step_ms for r in on.ranks) - statistics.fmean(r.mean_step_ms for r in off.ranks)
    assert saved > found.max_saving_ms
    assert anomaly(off) is None and all(s.anomaly is None for r in off.ranks for s in r.steps)


def test_the_checks_reads_are_not_told_as_the_loops_own_syncs():
    summary = analyze_folder(case("cpu_anomaly"))
    assert not any(f.code == "host_sync" for f in summary.findings)
    assert all(s.sync_calls == 0 for r in summary.ranks for s in r.steps)


def test_tracebacks_the_samples_put_in_one_step_do_not_make_anomaly_modes_cost_one_steps():
    # Samples 5 ms apart put forward's tracebacks in whichever step one fell in: a steady cost must not read as one
    # step's (the device check's CPU run once told it an info line, "most of it is one step's").
    summary = analyze_folder(case("cpu_anomaly"))
    ranks = [
        r.model_copy(update={"steps": [
            s.model_copy(update={"anomaly": s.anomaly.model_copy(update={"traceback_ms": 200.0 if i == 0 else 0.0})})
            for i, s in enumerate(r.steps) if s.anomaly
        ]})
        for r in summary.ranks
    ]
    found = anomaly_mode(ranks, [])
    assert found is not None and found.severity == "warning" and "one step's" not in found.evidence


def test_a_straggler_that_alone_runs_anomaly_detection_is_told_to_turn_it_off_there():
    summary = analyze_folder(case("cpu_anomaly_rank0"))
    lead = summary.findings[0]
    assert lead.code == "straggler" and lead.ranks == [0]
    assert lead.title == "Rank 0 is a straggler: it alone runs autograd's anomaly detection"
    assert "It alone checks every gradient for NaN (35 checks" in lead.evidence
    assert lead.fix.startswith("Turn autograd's anomaly detection off on rank 0")


def test_the_anomaly_finding_says_which_ranks_run_it_while_the_others_wait():
    found = anomaly(analyze_folder(case("cpu_anomaly_rank0")))
    assert found is not None and found.ranks == [0]
    assert "Only rank 0 runs it: the others wait at the next collective." in found.evidence


def test_lightning_detect_anomaly_is_told_as_the_trainers_setting():
    found = anomaly(analyze_folder(case("cpu_lightning_anomaly")))
    assert found is not None and found.severity == "warning"
    assert found.fix.endswith(
        "In Lightning's Trainer: Trainer(detect_anomaly=False), its default: with True it runs the whole fit under "
        "torch.autograd.set_detect_anomaly(True)."
    )


def test_a_with_stack_trace_times_forwards_tracebacks_from_its_frames():
    summary = analyze_folder(case("cpu_anomaly_stack"))
    (rank,) = summary.ranks
    tracebacks = [s.anomaly.traceback_ms for s in rank.steps if s.anomaly]
    assert len(tracebacks) == len(rank.steps) and all(0 < ms < s.phases.forward for ms, s in zip(tracebacks, rank.steps))
    found = anomaly(summary)
    assert found is not None and "ms a step in torch/fx/traceback.py's format_stack" in found.evidence


def launch(ts: float, corr: int, tid: int = 1) -> dict[str, Any]:
    return x_event("cudaLaunchKernel", ts, 5, cat="cuda_runtime", tid=tid, correlation=corr)


def _device_steps(tmp_path: Path) -> Summary:
    """Three 10 ms GPU steps whose backward (on the autograd thread) runs one node with a NaN check: the check's read
    waits 2.35 ms for a long kernel the device runs meanwhile, then the next kernel is launched at once."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        o, c = 10_000 * i, 10 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 10_000, cat="user_annotation"),
            launch(o, c + 1), kernel(o + 5, 1000, c + 1),
            x_event(NODE, o + 1000, 3200, tid=2),
            x_event("AddmmBackward0", o + 1000, 500, tid=2), launch(o + 1100, c + 2, tid=2), kernel(o + 1100, 2900, c + 2),
            x_event("aten::isnan", o + 1500, 100, tid=2), launch(o + 1550, c + 3, tid=2), kernel(o + 4000, 5, c + 3),
            x_event("aten::_is_any_true", o + 1600, 100, tid=2), launch(o + 1650, c + 4, tid=2), kernel(o + 4005, 5, c + 4),
            x_event("aten::item", o + 1700, 2350, tid=2),
            x_event("aten::_local_scalar_dense", o + 1710, 2330, tid=2),
            x_event("cudaMemcpyAsync", o + 1720, 2310, cat="cuda_runtime", tid=2, correlation=c + 5),
            x_event("Memcpy DtoH (Device -> Pageable)", o + 4010, 5, cat="gpu_memcpy", pid=0, tid=7, correlation=c + 5, stream=7, device=0),
            launch(o + 4100, c + 6, tid=2), kernel(o + 4110, 5800, c + 6),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_on_a_device_the_checks_cost_at_most_the_idle_time_they_leave(tmp_path: Path):
    summary = _device_steps(tmp_path)
    (rank,) = summary.ranks
    found = anomaly(summary)
    assert rank.idle is not None and all(s.anomaly is not None and s.anomaly.checks == 1 for s in rank.steps)
    # The read waited 2.35 ms, while the device ran the node's kernel: that wait costs only the idle time around it,
    # the checks' own (idle cause anomaly).
    assert found is not None and found.max_saving_ms == rank.idle.ms("anomaly") < 2.35
    # No stack timed forward's tracebacks: the figure is what turning it off saves at least.
    assert found.saving_floor
    assert "the autograd thread waits for every kernel queued before it" in found.evidence


def test_a_nan_check_outside_a_backward_node_is_not_anomaly_detections():
    spans = [
        Span(0, 100, "aten::isnan", "cpu_op", 1, 1),
        Span(100, 200, "aten::_is_any_true", "cpu_op", 1, 1),
        Span(200, 300, "aten::item", "cpu_op", 1, 1),
    ]
    assert nan_checks([by_kind(spans)]) == []
    node = Span(0, 300, NODE, "cpu_op", 1, 1)
    assert nan_checks([by_kind([node, *spans])]) == [tuple(spans)]


_NAMES = ("aten::isnan", "aten::_is_any_true", "aten::item", NODE, "aten::add")


@given(st.lists(st.tuples(st.sampled_from(_NAMES), st.integers(0, 1000), st.integers(0, 300)), max_size=40))
def test_every_check_found_is_an_isnan_then_its_test_then_a_read_inside_one_backward_node(raw):
    spans = [Span(float(ts), float(ts + dur), name, "cpu_op", 1, 1) for name, ts, dur in raw]
    nodes = [s for s in spans if s.name == NODE]
    for isnan, test, read in nan_checks([by_kind(spans)]):
        assert (isnan.name, test.name, read.name) == _NAMES[:3]
        assert isnan.end <= test.ts and test.end <= read.ts
        assert any(n.ts <= isnan.ts and read.end <= n.end for n in nodes)


def test_the_gap_after_a_checks_read_is_anomaly_detections_not_a_sync_of_the_loops(tmp_path: Path):
    # On an H200 a CNN under detect_anomaly() left 1.1 ms a step of such gaps, and its one cudaDeviceSynchronize a
    # step was told a warning for them ("drop it", 11% of the step): they were every sync's drain.
    (rank,) = _device_steps(tmp_path).ranks
    assert rank.idle is not None
    causes = {c.cause: c.ms_per_step for c in rank.idle.causes}
    assert "sync" not in causes
    # From the read's end (4.05 ms) to the next kernel (4.11 ms), and the check's own idle before it.
    assert causes["anomaly"] >= 0.06


def test_the_utilization_finding_leaves_forwards_tracebacks_to_the_anomaly_finding(tmp_path: Path):
    # Three 10 ms steps: a 0.5 ms kernel, then forward formats tracebacks for 3 ms (with_stack frames) while the device
    # idles, a backward node's NaN check, and the last kernel. The tracebacks are anomaly detection's: the host-bound
    # finding that counted them too told the same idle time twice (on the H200, 7.9 ms against its 4.1).
    events: list[dict[str, Any]] = []
    for i in range(3):
        o, c = 10_000 * i, 10 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 10_000, cat="user_annotation"),
            launch(o, c + 1), kernel(o + 5, 500, c + 1),
            x_event("aten::addmm", o + 600, 3000),
            x_event("torch/fx/traceback.py(64): format_stack", o + 610, 2980, cat="python_function"),
            x_event(NODE, o + 4000, 1000, tid=2),
            x_event("aten::isnan", o + 4100, 100, tid=2), launch(o + 4150, c + 3, tid=2), kernel(o + 4200, 5, c + 3),
            x_event("aten::_is_any_true", o + 4200, 100, tid=2), launch(o + 4250, c + 4, tid=2), kernel(o + 4300, 5, c + 4),
            x_event("aten::item", o + 4300, 200, tid=2),
            launch(o + 9000, c + 6), kernel(o + 9010, 900, c + 6),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    summary = analyze_folder(tmp_path)
    (rank,) = summary.ranks
    low = next(f for f in summary.findings if f.code == "low_gpu_utilization")
    traced = statistics.fmean(s.anomaly.traceback_ms for s in rank.steps if s.anomaly)
    assert traced == pytest.approx(2.98)
    assert rank.idle is not None and low.max_saving_ms <= rank.idle.idle_ms_per_step - traced + 1e-6
    assert "anomaly detection's tracebacks" in low.evidence


def test_on_an_h200_the_checks_are_told_within_what_turning_them_off_saved():
    # The device check's CNN under detect_anomaly() on an H200 (benchmarks/results/gpu-h200-run5.json: 7.2 ms a step
    # with it, 3.0 ms without, the agent's capture); its one cudaDeviceSynchronize a step is the check's own timing.
    summary = analyze_folder(case("h200_anomaly"))
    (rank,) = summary.ranks
    found = anomaly(summary)
    assert found is not None and found.severity == "warning" and found.max_saving_ms <= 7.2 - 3.0
    assert rank.idle is not None and rank.idle.ms("anomaly") > 0
    # Before: a host_sync warning (1.3 ms, "drop it") for the gaps after the checks' reads.
    host_sync = next((f for f in summary.findings if f.code == "host_sync"), None)
    assert host_sync is None or host_sync.max_saving_ms < 0.5
    low = next(f for f in summary.findings if f.code == "low_gpu_utilization")
    assert low.max_saving_ms + found.max_saving_ms <= rank.idle.idle_ms_per_step
