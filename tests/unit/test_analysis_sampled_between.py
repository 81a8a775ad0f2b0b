"""The agent's stack samples name the work a loop does between steps, where the trace shows only that it ran.

Recorded (tests/data/record_cpu_issue29.py, the agent's samples every 5 ms in the trace): cpu_hf_trainer_save_sampled
(a transformers Trainer with save_steps=3) and cpu_lightning_validate_sampled (Lightning validating on two batches
and saving a checkpoint after the third step). Before the samples were read, the note could only guess ("most
likely a checkpoint save writing its files, or a logger's network calls").
"""

from __future__ import annotations

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.python_frames import sampled_path
from orchestrator.analysis.untraced import Timeline
from orchestrator.models.samples import FrameSamples
from tests.support.tracefiles import case

LOOP = "train.py(5): loop"
STEP = ["train.py(10): step", LOOP]
SAVE = ["torch/serialization.py(900): _save", "mylib/ckpt.py(30): write", "train.py(20): save", LOOP]
LOG = ["threading.py(300): wait", "logger.py(7): send", "train.py(22): log", LOOP]


def _note(summary) -> str | None:
    return next((i for i in summary.issues if " before it fetches its batch " in i), None)


def test_the_samples_name_where_a_trainers_save_between_steps_runs():
    summary = analyze_folder(case("cpu_hf_trainer_save_sampled"))
    saved = next(s for s in summary.ranks[0].steps if s.step == 3)
    assert saved.between_samples > 0 and saved.between_frames
    # The path begins where the Trainer leaves its training loop for its save, logging and evaluation.
    assert saved.between_frames[0].name.startswith("transformers/trainer.py(")
    assert saved.between_frames[0].name.endswith("): _maybe_log_save_evaluate")
    note = _note(summary)
    assert note is not None and "; the stack samples there: " in note
    assert "under _maybe_log_save_evaluate (transformers/trainer.py:" in note


def test_the_samples_find_the_checkpoint_save_beside_a_lightning_validation():
    # The trace shows two loader reads and torch ops before the batch (an evaluation); the samples find that most
    # of the time is ModelCheckpoint's save, which runs right after it.
    note = _note(analyze_folder(case("cpu_lightning_validate_sampled")))
    assert note is not None and "most likely an evaluation: it reads a DataLoader 2 times" in note
    assert "in _atomic_save (lightning/fabric/utilities/cloud_io.py:" in note


def test_steps_without_work_before_their_batch_carry_no_sampled_path():
    summary = analyze_folder(case("cpu_hf_trainer_save_sampled"))
    assert [s.between_frames for s in summary.ranks[0].steps if s.step != 3] == [[], []]


def test_the_hot_path_follows_the_frames_most_samples_hold_past_torch_and_the_standard_library():
    path = sampled_path([SAVE, SAVE, SAVE, LOG], share=0.5, interval_ms=5)
    assert [(f.name, f.calls, f.total_ms) for f in path] == [
        (LOOP, 4, 20.0), ("train.py(20): save", 3, 15.0), ("mylib/ckpt.py(30): write", 3, 15.0),
    ]


def test_no_frame_holds_half_the_samples_no_path_past_the_loop():
    assert [f.name for f in sampled_path([SAVE, LOG], share=0.75, interval_ms=5)] == [LOOP]


def test_the_path_begins_at_the_first_frame_the_steps_own_samples_do_not_hold():
    samples = FrameSamples(
        interval_ms=5, stacks=[STEP, SAVE],
        # One step of 0-100 µs whose head (0-40) saves; its own work after the head runs `step`.
        samples=[(1_000_010, 1), (1_000_020, 1), (1_000_030, 1), (1_000_060, 0), (1_000_080, 0)],
    )
    ((n, path),) = Timeline.of(samples, base_us=1_000_000).paths([[(0.0, 40.0)]], [(0.0, 100.0)])
    assert n == 3 and [f.name for f in path] == ["train.py(20): save", "mylib/ckpt.py(30): write"]


def test_at_line_the_path_begins_at_the_loops_own_line_that_calls_the_work():
    inline = ["mylib/ckpt.py(30): write", "train.py(7): loop"]  # the loop calls write itself, at its line 7
    samples = FrameSamples(
        interval_ms=5, stacks=[STEP, inline],
        samples=[(1_000_010, 1), (1_000_020, 1), (1_000_030, 1), (1_000_060, 0), (1_000_080, 0)],
    )
    timeline = Timeline.of(samples, base_us=1_000_000)
    ((_, by_function),) = timeline.paths([[(0.0, 40.0)]], [(0.0, 100.0)])
    ((_, by_line),) = timeline.paths([[(0.0, 40.0)]], [(0.0, 100.0)], at_line=True)
    assert [f.name for f in by_function] == ["mylib/ckpt.py(30): write"]
    assert [f.name for f in by_line] == ["train.py(7): loop", "mylib/ckpt.py(30): write"]
