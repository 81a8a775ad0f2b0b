"""Who reads device values back every step: the host_sync finding names the Python function around each read (a
with_stack trace's innermost frame of the user's or a library's code), tells a known library's setting for its own
reads, and without stacks says how to find the line.

Shaped after a Hugging Face Trainer recording (tests/data/traces/cpu_hf_trainer_stacks, tested with the real trace in
test_analysis_cpu_foreign.py): before, the finding said "3 waits per step (aten::item)" and nothing about whose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.python_frames import frame_parts
from orchestrator.analysis.readers import readers, reading_fix
from orchestrator.analysis.spans import READING_OPS, SYNCHRONIZE_CALLS
from orchestrator.models.analysis import Finding, OpStat, PhaseTimes, RankSummary, StepBreakdown
from tests.support.realtraces import finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch


def _frame(name: str, ts: float, dur: float) -> dict[str, Any]:
    return x_event(name, ts, dur, cat="python_function")


def _read(ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    """loss.item() on a device: the aten::item around a device-to-host copy that waits for the queued kernels."""
    return [
        x_event("aten::item", ts, dur),
        x_event("cudaMemcpyAsync", ts + 1, dur - 2, cat="cuda_runtime", correlation=corr),
        x_event("Memcpy DtoH (Device -> Pageable)", ts + dur - 3, 1, cat="gpu_memcpy", pid=0, tid=7, correlation=corr, stream=7, device=0),
    ]


def _step(tmp_path: Path, events: list[dict[str, Any]]) -> tuple[RankSummary, Finding]:
    """A 1 ms step: a 300 µs kernel, then the host reads a value back (``events``) and launches again after the wait."""
    write_trace(
        tmp_path / "rank0.pt.trace.json",
        [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), launch(0, 1), kernel(10, 300, 1), *events, launch(900, 9), kernel(905, 90, 9)],
        world_size=1,
    )
    summary = analyze_folder(tmp_path)
    return summary.ranks[0], finding(summary, "host_sync")


def test_a_read_is_named_by_the_innermost_frame_of_the_users_code_around_it(tmp_path: Path) -> None:
    rank, read = _step(
        tmp_path,
        [
            _frame("train.py(40): train_step", 5, 990),
            _frame("metrics.py(12): running_loss", 20, 320),
            _frame("torch/_tensor.py(1100): __format__", 25, 310),  # torch's own Python: its caller's
            *_read(30, 300, 2),
        ],
    )
    assert [(c.name, c.calls) for c in rank.sync_callers] == [("metrics.py(12): running_loss", 1)]
    assert "Made by (Python, innermost frame of your or a library's code): running_loss (metrics.py:12) 1 a step." in read.evidence
    assert read.fix.startswith("The reads are mostly in running_loss (metrics.py:12) (1x per step): start there. Keep loss.item()")


def test_a_known_librarys_reads_are_told_the_setting_that_removes_them(tmp_path: Path) -> None:
    trainer = "/venv/lib/python3.11/site-packages/transformers/trainer.py(2480): _inner_training_loop"
    _, read = _step(tmp_path, [_frame(trainer, 5, 990), *_read(30, 300, 2)])
    assert "logging_nan_inf_filter=False" in read.fix


def test_no_function_is_named_in_the_fix_when_none_holds_most_of_the_waiting(tmp_path: Path) -> None:
    rank, read = _step(
        tmp_path,
        [_frame("train.py(40): log_loss", 20, 160), *_read(30, 140, 2), _frame("train.py(60): log_accuracy", 190, 160), *_read(200, 140, 3)],
    )
    assert {c.name for c in rank.sync_callers} == {"train.py(40): log_loss", "train.py(60): log_accuracy"}
    assert read.fix.startswith("Keep loss.item()")


def test_reads_rarer_than_once_a_step_in_an_op_are_still_told_what_to_write_instead() -> None:
    # A mask's aten::nonzero read in 1 of 4 steps, from two functions alike: no function holds most of the reads and
    # no op reads every step. Before: an empty fix.
    rank = _rank([("aten::nonzero", 1)], [("train.py(40): drop_padding", 1, 2.0), ("train.py(60): log_tokens", 1, 2.0)], 4, False)
    assert reading_fix(rank).startswith("aten::nonzero (1 in 4 steps): ops that size their output from the data read a count back first")


def test_a_rare_synchronize_beside_item_reads_does_not_lead_the_fix() -> None:
    # HTA's trace_diff control A100 trace: 10 reads a step (aten::to, aten::item) and a cudaDeviceSynchronize in 1 of 6.
    rank = _rank([("aten::item", 50), ("cudaDeviceSynchronize", 1)], [], 6, False)
    assert reading_fix(rank).startswith("To see which Python line reads, profile with with_stack=True. Keep loss.item()")


def test_reads_with_no_op_and_no_leading_function_get_the_advice_for_reading_values() -> None:
    rank = _rank([], [("train.py(40): log_loss", 1, 2.0), ("train.py(60): log_accuracy", 1, 2.0)], 1, False)
    assert reading_fix(rank).startswith("Keep loss.item()")


def test_on_a_cpu_the_function_that_reads_most_often_is_named(tmp_path: Path) -> None:
    # No read waits on a CPU: the longest item() says nothing; the most frequent reader is the one to change.
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _frame("train.py(40): log_loss", 10, 300), x_event("aten::item", 20, 200),
        _frame("train.py(60): log_accuracy", 400, 500),
        *(x_event("aten::item", 410 + 100 * i, 20) for i in range(3)),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    read = finding(analyze_folder(tmp_path), "host_sync")
    assert read.fix.startswith("The reads are mostly in log_accuracy (train.py:60) (3x per step)")


def test_a_users_region_around_the_reads_is_named_before_the_function(tmp_path: Path) -> None:
    _, read = _step(
        tmp_path,
        [x_event("MASK INDICES", 20, 320, cat="user_annotation"), _frame("model.py(7): mask_indices", 25, 310), *_read(30, 300, 2)],
    )
    assert read.fix.startswith("The region 'MASK INDICES' reads tensor values back to the host 1x per step")
    assert "running" not in read.fix and "mostly in" not in read.fix


def test_without_stacks_the_fix_says_how_to_find_the_line(tmp_path: Path) -> None:
    rank, read = _step(tmp_path, _read(30, 300, 2))
    assert rank.sync_callers == []
    assert "Made by" not in read.evidence
    assert read.fix.startswith("To see which Python line reads, profile with with_stack=True. Keep loss.item()")


@given(st.text(max_size=120))
def test_any_text_is_a_frame_or_none_never_an_error(name: str) -> None:
    parts = frame_parts(name)
    assert parts is None or all(isinstance(p, str) for p in parts)


@given(
    st.sampled_from(["", "/venv/lib/python3.11/site-packages/", "/usr/lib/python3/dist-packages/"]),
    st.from_regex(r"[a-z_]{1,8}(/[a-z_]{1,8}){0,2}\.py", fullmatch=True),
    st.integers(min_value=0, max_value=10**6),
    st.from_regex(r"[A-Za-z_<>][A-Za-z0-9_<>]{0,20}", fullmatch=True),
)
def test_a_frame_is_its_file_under_site_packages_and_its_function(root: str, path: str, line: int, func: str) -> None:
    assert frame_parts(f"{root}{path}({line}): {func}") == (path, func)


def test_a_grad_scaler_beside_other_reads_is_told_with_how_to_find_the_rest(tmp_path: Path) -> None:
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("aten::item", 100, 20), x_event("aten::item", 300, 20),  # found_inf, and the job's own loss.item()
        x_event("Optimizer.step#AdamW.step", 400, 200, cat="user_annotation"), x_event("aten::_foreach_add_", 410, 100),
        x_event("aten::_amp_update_scale_", 700, 20),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    read = finding(analyze_folder(tmp_path), "host_sync")
    assert read.fix.startswith("torch.amp.GradScaler reads found_inf back once a step (scaler.step)")
    assert "with fused=True on AdamW" in read.fix and "To see which Python line reads, profile with with_stack=True." in read.fix


def _read_inside(op: str, inner: str, ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    """``op`` reading a value back through ``inner`` (x[mask]: aten::index > aten::nonzero; if t: aten::is_nonzero >
    aten::_local_scalar_dense), the device-to-host copy and the wait, as CUDA traces record them."""
    return [
        x_event(op, ts, dur), x_event(inner, ts + 1, dur - 2),
        x_event("cudaMemcpyAsync", ts + 2, 4, cat="cuda_runtime", correlation=corr),
        x_event("Memcpy DtoH (Device -> Pageable)", ts + dur - 6, 1, cat="gpu_memcpy", pid=0, tid=7, correlation=corr, stream=7, device=0),
        x_event("cudaStreamSynchronize", ts + 7, dur - 10, cat="cuda_runtime"),
    ]


def test_boolean_mask_indexing_is_named_and_told_to_keep_shapes_static(tmp_path: Path) -> None:
    # Before: the read was named by the copy inside it ("aten::copy_") and told the loss.item() advice.
    rank, read = _step(tmp_path, _read_inside("aten::index", "aten::nonzero", 30, 300, 2))
    assert [(o.name, o.calls) for o in rank.sync_ops] == [("aten::index", 1)]
    assert read.fix.startswith("aten::index (1x per step): ops that size their output from the data read a count back first")
    assert "torch.where(mask, x, 0)" in read.fix and "nonzero_static" in read.fix


def test_a_tensor_in_a_python_condition_is_told_to_decide_on_the_device(tmp_path: Path) -> None:
    rank, read = _step(tmp_path, _read_inside("aten::is_nonzero", "aten::_local_scalar_dense", 30, 300, 2))
    assert [(o.name, o.calls) for o in rank.sync_ops] == [("aten::is_nonzero", 1)]
    assert read.fix.startswith("aten::is_nonzero (1x per step): a tensor turned into a Python bool (if t:")


def test_a_synchronize_in_the_loop_is_told_to_drop_it_or_time_with_events(tmp_path: Path) -> None:
    # PARAM's benchmark harness: cudaDeviceSynchronize five times a step, no op around it. Before: "Keep loss.item()".
    rank, read = _step(tmp_path, [x_event("cudaDeviceSynchronize", 30, 300, cat="cuda_runtime")])
    assert [(o.name, o.calls) for o in rank.sync_ops] == [("cudaDeviceSynchronize", 1)]
    assert read.fix.startswith("cudaDeviceSynchronize (1x per step): the loop waits for the device itself (torch.cuda.synchronize()")
    assert "CUDA events" in read.fix and "loss.item()" not in read.fix


_NAMES = st.one_of(
    st.sampled_from(sorted(READING_OPS | SYNCHRONIZE_CALLS | {"aten::item", "aten::to", "HOST ROUND TRIP / aten::item"})),
    st.text(max_size=40),
)
_FRAMES = st.one_of(
    st.sampled_from([
        "transformers/trainer.py(1957): _run_epoch", "lightning/pytorch/trainer/connectors/logger_connector/result.py(470): metrics",
        "train.py(40): step",
    ]),
    st.text(max_size=60),
)


def _rank(ops: list[tuple[str, int]], frames: list[tuple[str, int, float]], steps: int, grad_scaler: bool) -> RankSummary:
    return RankSummary(
        rank=0, host="h", file="f", device="cpu", mean_step_ms=1.0, median_step_ms=1.0, mean_phases=PhaseTimes(),
        comm_wait_ms=0.0, grad_scaler=grad_scaler, optimizers=["AdamW"], optimizer_impl="foreach",
        steps=[StepBreakdown(step=i, start_unix_us=0.0, duration_ms=1.0, phases=PhaseTimes()) for i in range(steps)],
        sync_ops=[OpStat(name=n, calls=c, total_ms=0.1) for n, c in ops],
        sync_callers=[OpStat(name=n, calls=c, total_ms=ms) for n, c, ms in frames],
    )


@given(
    st.lists(st.tuples(_NAMES, st.integers(1, 50)), max_size=6),
    st.lists(st.tuples(_FRAMES, st.integers(1, 50), st.floats(0.0, 1e4)), max_size=4),
    st.integers(1, 8),
    st.booleans(),
)
def test_any_reads_get_a_fix_that_names_no_more_than_the_trace_holds(
    ops: list[tuple[str, int]], frames: list[tuple[str, int, float]], steps: int, grad_scaler: bool
) -> None:
    # The names come from traces rayprof did not write: any of them, in any mix, gives a fix and never raises.
    rank = _rank(ops, frames, steps, grad_scaler)
    fix, listed = reading_fix(rank), readers(rank)
    assert fix and fix == fix.strip()
    assert ("with_stack=True" in fix) == (not frames and not _region_holds_most(ops) and not _scaler_alone(rank))
    assert ("GradScaler" in fix) == (grad_scaler and not _region_holds_most(ops))
    assert (listed == "") == (not frames)


def _region_holds_most(ops: list[tuple[str, int]]) -> bool:
    by: dict[str, int] = {}
    for name, calls in ops:
        region, _, rest = name.rpartition(" / ")
        if region and rest and not region.startswith("Optimizer."):
            by[region] = by.get(region, 0) + calls
    return bool(by) and 2 * max(by.values()) >= sum(c for _, c in ops)


def _scaler_alone(rank: RankSummary) -> bool:
    return rank.grad_scaler and sum(o.calls for o in rank.sync_ops) <= len(rank.steps)
