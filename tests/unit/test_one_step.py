"""When one step of a window carries a cost (finding_base.one_step): what a finding that reads the mean then says."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.finding_base import ONE_STEP_OTHERS_FRACTION, ONE_STEP_SHARE, one_step
from orchestrator.models.analysis import Finding, PhaseTimes, RankSummary, StepBreakdown
from tests.support.tracefiles import write_trace, x_event


def _rank(n: int) -> RankSummary:
    steps = [StepBreakdown(step=10 + i, start_unix_us=0.0, duration_ms=1.0, phases=PhaseTimes()) for i in range(n)]
    return RankSummary(
        rank=0, host="h", file="f", device="cpu", steps=steps, mean_step_ms=1.0, median_step_ms=1.0,
        mean_phases=PhaseTimes(), comm_wait_ms=0.0,
    )


def test_a_first_step_that_holds_the_cost_is_named_with_the_others_median() -> None:
    found = one_step(_rank(3), [3.8, 0.5, 0.4])
    assert found is not None
    assert (found.step, found.ms, found.others, found.others_ms) == (10, 3.8, 2, 0.45)
    assert found.fraction == 3.8 / 4.7


def test_a_cost_every_step_pays_or_a_window_under_three_steps_is_no_one_step() -> None:
    assert one_step(_rank(4), [2.0, 2.1, 1.9, 2.0]) is None
    assert one_step(_rank(2), [10.0, 0.0]) is None
    assert one_step(_rank(3), [0.0, 0.0, 0.0]) is None


def test_spikes_in_two_steps_are_a_recurring_cost() -> None:
    # A loader that falls behind every few steps: the mean is its cost.
    assert one_step(_rank(6), [5.0, 0.1, 0.1, 5.0, 0.1, 0.1]) is None


@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=3, max_size=40))
def test_a_named_step_holds_the_share_and_the_others_stay_under_the_bar(values: list[float]) -> None:
    found = one_step(_rank(len(values)), values)
    if found is None:
        return
    top = max(values)
    assert found.ms == top and found.step == 10 + values.index(top)
    assert found.fraction >= ONE_STEP_SHARE and found.fraction == top / sum(values)
    assert found.others_ms <= ONE_STEP_OTHERS_FRACTION * top
    rest = list(values)
    rest.remove(top)
    assert found.others_ms == statistics.median(rest) and found.others == len(values) - 1


def _steps_trace(tmp_path: Path, n: int) -> list[str]:
    events = []
    for i in range(n):
        events += [x_event(f"ProfilerStep#{6 + i}", 1000 * i, 900, cat="user_annotation"), x_event("aten::mm", 1000 * i + 10, 800)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path).issues


def test_a_window_of_one_step_says_a_one_off_reads_the_same(tmp_path: Path) -> None:
    # TraceLens' H100/MI300 recordings hold ProfilerStep#6 alone; HTA's Triton example ProfilerStep#1.
    assert any(i.startswith("one step analysed (step 6): a one-off") for i in _steps_trace(tmp_path, 1))


def test_a_window_of_two_steps_gets_no_one_step_note(tmp_path: Path) -> None:
    assert not any(i.startswith("one step analysed") for i in _steps_trace(tmp_path, 2))


def _shifted(event: dict[str, Any], by_us: float, step: int) -> dict[str, Any]:
    """``event`` moved into step ``step``, its correlation id (if any) made unique to that step."""
    out = {**event, "ts": event["ts"] + by_us}
    if "correlation" in event.get("args", {}):
        out["args"] = {**event["args"], "correlation": event["args"]["correlation"] + 1000 * step}
    return out


def _three_steps(tmp_path: Path, first_step: list[dict[str, Any]], every_step: list[dict[str, Any]]) -> list[Finding]:
    """Three 1 ms steps; ``first_step``'s events (times within a step) go into the first only."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        o = 1000 * i
        events.append(x_event(f"ProfilerStep#{i + 1}", o, 1000, cat="user_annotation"))
        events += [_shifted(e, o, i) for e in every_step + (first_step if i == 0 else [])]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path).findings


def test_a_collective_the_first_step_alone_waits_in_is_said_and_no_warning(tmp_path: Path) -> None:
    # A window's first all_reduce can carry the communicator's set-up (NCCL makes it lazily): 2.7 ms of a 1 ms mean
    # step at once. Before: "Communication does not overlap computation", a warning from that one step.
    found = _three_steps(tmp_path, [x_event("c10d::allreduce_", 100, 800)], [x_event("aten::mm", 0, 90)])
    comm = next(f for f in found if f.code == "comm_exposed")
    assert comm.severity == "info" and "one step's: step 1 has 0.8 ms" in comm.evidence


def test_a_collective_every_step_waits_in_keeps_its_warning(tmp_path: Path) -> None:
    found = _three_steps(tmp_path, [], [x_event("aten::mm", 0, 90), x_event("c10d::allreduce_", 100, 800)])
    comm = next(f for f in found if f.code == "comm_exposed")
    assert comm.severity == "warning" and "one step's" not in comm.evidence


def test_an_upload_the_first_step_alone_blocks_in_is_said_and_no_warning(tmp_path: Path) -> None:
    # A device trace: each step runs a kernel; the first also blocks 0.6 ms in a pinned upload the device starts late.
    upload = [
        x_event("aten::to", 300, 600),
        x_event("cudaMemcpyAsync", 302, 596, cat="cuda_runtime", correlation=99),
        x_event("Memcpy HtoD (Pinned -> Device)", 850, 40, cat="gpu_memcpy", pid=0, tid=7, correlation=99, stream=7, device=0),
    ]
    every = [
        x_event("cudaLaunchKernel", 0, 5, cat="cuda_runtime", correlation=1),
        x_event("volta_sgemm_128x64_nn", 5, 290, cat="kernel", pid=0, tid=7, correlation=1, stream=7, device=0),
    ]
    found = _three_steps(tmp_path, upload, every)
    copy = next(f for f in found if f.code == "htod_copy")
    assert copy.severity == "info" and "one step's: step 1 has" in copy.evidence
