"""Work the loop does between steps (a checkpoint save, an evaluation, logging), before a step fetches its batch:
one step that does it is said for what it is, on a CPU trace in a note and on a device in the idle finding's fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.between import between_note
from orchestrator.loops import METADATA_KEY
from orchestrator.models.analysis import Summary
from tests.support.realtraces import EXTERNAL_CASES, external, h100
from tests.support.tracefiles import case, with_header, write_trace, x_event

_FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _note(summary: Summary) -> str | None:
    return next((i for i in summary.issues if " before it fetches its batch " in i), None)


def test_a_checkpoint_saved_between_steps_is_told_in_a_note_on_its_step() -> None:
    # A transformers Trainer with save_steps=3 (recorded): the save runs before the fourth step fetches its batch.
    summary = analyze_folder(case("cpu_hf_trainer_save"))
    note = _note(summary)
    assert note is not None and note.startswith("step 3 spends ")
    saved = next(s for s in summary.ranks[0].steps if s.step == 3)
    assert saved.between_ops_ms is not None and saved.between_ops_ms < 0.01 * saved.between_ms
    # Before: "(a checkpoint save, an evaluation, logging)", whichever it was.
    assert (
        "work the loop does every so many steps (most likely a checkpoint save writing its files, or a logger's network "
        f"calls: torch ops run only {saved.between_ops_ms:.1f} ms of it, the rest is Python and I/O), not each step's"
    ) in note
    (rank,) = summary.ranks
    assert f"It lifts the mean step to {rank.mean_step_ms:.1f} ms against a {rank.median_step_ms:.1f} ms median" in note
    # The save is no finding: how often it recurs is the loop's setting, which one window cannot see.
    assert [f.code for f in summary.findings] == ["host_sync"]


def test_in_a_trainer_the_note_names_how_often_it_saves_evaluates_and_logs(tmp_path: Path) -> None:
    summary = analyze_folder(with_header(tmp_path, "cpu_hf_trainer_save", **{METADATA_KEY: "transformers_trainer"}))
    note = _note(summary)
    assert note is not None and (
        "In transformers' Trainer: TrainingArguments(save_steps=..., eval_steps=..., logging_steps=...) say how often "
        "it saves, evaluates and logs after a step."
    ) in note


def test_a_validation_between_steps_is_neither_data_loading_nor_forward() -> None:
    # Lightning (recorded) with val_check_interval=3 and ModelCheckpoint(every_n_train_steps=3): after the third step
    # it validates on two batches (fetched by the validation loader) and saves, before the fourth fetches its batch.
    # Before: that step's validation model was its forward (15.5 ms mean forward against 4.9) and on a longer
    # validation set its loader was the step's data loading (a dataloader_bound info line, "81% of it in step 3").
    summary = analyze_folder(case("cpu_lightning_validate"))
    note = _note(summary)
    assert note is not None and note.startswith("step 3 spends ")
    (rank,) = summary.ranks
    validated, *others = sorted(rank.steps, key=lambda s: -s.between_ms)
    assert validated.step == 3
    for phase in ("data", "forward"):
        assert validated.phases.get(phase) <= 2 * max(s.phases.get(phase) for s in others)
    assert validated.phases.other >= validated.between_ms > 10 * max(s.between_ms for s in others)


def test_a_validation_between_steps_is_told_as_an_evaluation_with_the_batches_it_reads() -> None:
    summary = analyze_folder(case("cpu_lightning_validate"))
    validated = next(s for s in summary.ranks[0].steps if s.step == 3)
    assert validated.between_fetches == 2 and 0 < (validated.between_ops_ms or 0) < validated.between_ms
    assert (
        "(most likely an evaluation: it reads a DataLoader 2 times before the step's own batch and runs "
        f"{validated.between_ops_ms:.1f} ms of torch ops; {validated.between_ms - (validated.between_ops_ms or 0):.1f} "
        "ms is Python and I/O), not each step's"
    ) in (_note(summary) or "")


def _cpu_steps(tmp_path: Path, head_ops_us: float) -> Summary:
    """Four 1 ms CPU steps, each a DataLoader fetch and a matmul; step 2 fetches 0.6 ms late, running torch ops for
    ``head_ops_us`` of that time (metrics it computes) and no op for the rest."""
    events: list[dict[str, Any]] = []
    for i in range(4):
        o = 1000 * i
        head = 600 if i == 1 else 5
        events += [x_event(f"ProfilerStep#{i + 1}", o, 1000, cat="user_annotation")]
        events += [x_event("aten::add", o + 5, head_ops_us)] if i == 1 and head_ops_us else []
        events += [x_event(_FETCH, o + head, 10, cat="user_annotation"), x_event("aten::mm", o + head + 12, 300)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_work_before_the_batch_that_runs_torch_ops_and_reads_no_loader_is_not_named(tmp_path: Path) -> None:
    summary = _cpu_steps(tmp_path, head_ops_us=300)
    assert summary.ranks[0].steps[1].between_ops_ms == pytest.approx(0.3)
    assert "every so many steps (a checkpoint save, an evaluation, logging), not each step's" in (_note(summary) or "")


def test_work_before_the_batch_in_no_torch_op_is_told_as_python_and_io(tmp_path: Path) -> None:
    summary = _cpu_steps(tmp_path, head_ops_us=20)
    assert "(most likely a checkpoint save writing its files" in (_note(summary) or "")


def test_a_summary_from_before_the_ops_were_measured_is_told_the_kinds_it_may_be(tmp_path: Path) -> None:
    (rank,) = _cpu_steps(tmp_path, head_ops_us=20).ranks
    older = rank.model_copy(update={"steps": [s.model_copy(update={"between_ops_ms": None}) for s in rank.steps]})
    assert "every so many steps (a checkpoint save, an evaluation, logging)" in (between_note([older]) or "")


@pytest.mark.parametrize("name", ["cpu_hf_trainer", "cpu_hf_trainer_accumulate", "cpu_lightning", "cpu_data_bound"])
def test_steps_that_fetch_their_batch_first_get_no_note(name: str) -> None:
    assert _note(analyze_folder(case(name))) is None


@pytest.mark.parametrize("name", EXTERNAL_CASES)
def test_no_real_trace_is_told_work_between_its_steps(name: str) -> None:
    assert _note(external(name)) is None


def test_neither_h100_recording_is_told_work_between_its_steps() -> None:
    assert _note(h100("seed003_before")) is None and _note(h100("seed003_after")) is None


def _device_steps(tmp_path: Path, *late_fetch_steps: int) -> Summary:
    """Four 1 ms steps, each a DataLoader fetch and one kernel filling the rest of the step; the steps numbered
    ``late_fetch_steps`` fetch 0.6 ms late (the host in no op before it) and run a shorter kernel after it."""
    events: list[dict[str, Any]] = []
    for i in range(4):
        o, late = 1000 * i, i + 1 in late_fetch_steps
        head = 600 if late else 5
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 1000, cat="user_annotation"),
            x_event(_FETCH, o + head, 10, cat="user_annotation"),
            x_event("aten::mm", o + head + 12, 8),
            x_event("cudaLaunchKernel", o + head + 13, 5, cat="cuda_runtime", correlation=i + 1),
            x_event(
                "volta_sgemm_128x64_nn", o + head + 20, (300 if late else 900) - 30, cat="kernel", pid=0, tid=7,
                correlation=i + 1, stream=7, device=0,
            ),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_on_a_device_the_idle_one_step_holds_before_its_batch_is_told_as_the_loops_periodic_work(tmp_path: Path) -> None:
    # Before: "The host runs code the profiler does not name ...: profile with with_stack=True", sent looking for
    # what is the loop's own checkpoint or evaluation.
    summary = _device_steps(tmp_path, 2)
    (idle,) = [f for f in summary.findings if f.code == "low_gpu_utilization"]
    assert idle.fix.startswith("The device idles 0.7 ms in step 2 while the host works before fetching that step's batch")
    assert "with_stack" not in idle.fix
    assert [s.between_ms for s in summary.ranks[0].steps] == pytest.approx([0.005, 0.6, 0.005, 0.005])


def test_on_a_device_unnamed_host_time_every_step_spends_before_its_batch_is_told_where_it_runs(tmp_path: Path) -> None:
    # Every step: 0.6 ms of Python in no op before the fetch (logging, metrics), while the device idles.
    summary = _device_steps(tmp_path, 1, 2, 3, 4)
    (idle,) = [f for f in summary.findings if f.code == "low_gpu_utilization"]
    assert idle.fix.startswith("The host runs code the profiler does not name while the device idles")
    assert "most of it before each step fetches its batch (0.6 ms a step after the optimizer step" in idle.fix
    assert _note(summary) is None


def _recurring(summary: Summary) -> str | None:
    return next((i for i in summary.issues if " before they fetch their batch " in i), None)


def test_evaluations_every_third_step_are_told_with_their_period_and_what_they_cost() -> None:
    # tests/data/record_cpu_loops.py, evaluate_often: three evaluations in eight steps are no one step's cost; before,
    # the window said nothing of them.
    note = _recurring(analyze_folder(case("cpu_evaluate_often")))
    assert note is not None and note.startswith("steps 3, 6 and 9 (every 3 steps) spend ")
    assert "most likely an evaluation: it reads a DataLoader 6 times before the step's own batch" in note
    assert "Every 3 steps, it costs " in note


def _moved(summary: Summary, heads: dict[int, float]) -> list[Any]:
    (r,) = summary.ranks
    return [r.model_copy(update={"steps": [
        s.model_copy(update={"between_ms": heads.get(s.step, s.between_ms)}) for s in r.steps
    ]})]


def test_work_between_steps_at_uneven_intervals_is_costed_at_the_windows_rate() -> None:
    summary = analyze_folder(case("cpu_evaluate_often"))
    head = summary.ranks[0].steps[-1].between_ms
    note = between_note(_moved(summary, {8: head, 9: 0.0}))
    assert note is not None and note.startswith("steps 3, 6 and 8 spend ") and "At this window's rate" in note


def test_work_before_the_batch_in_most_steps_is_no_periodic_work() -> None:
    summary = analyze_folder(case("cpu_evaluate_often"))
    head = summary.ranks[0].steps[-1].between_ms
    assert between_note(_moved(summary, dict.fromkeys([2, 4, 5, 7, 8], head))) is None


def test_two_slow_steps_one_after_the_other_are_given_no_period() -> None:
    # A live Ignite window on a busy host: its first two steps read "(every 1 steps)" beside six steps without such work.
    summary = analyze_folder(case("cpu_evaluate_often"))
    head = summary.ranks[0].steps[-1].between_ms
    note = between_note(_moved(summary, {3: head, 4: head, 6: 0.0, 9: 0.0}))
    assert note is not None and note.startswith("steps 3 and 4 spend ")
    assert "every 1 steps" not in note.lower() and "At this window's rate, it costs " in note
