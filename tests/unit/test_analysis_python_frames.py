"""Python the host runs outside any op, named from a with_stack trace's Python frames: the innermost frame of the
user's or a library's code, never torch's, numpy's or the standard library's; and the fix that follows from it.

Shaped after TraceLens' H100 TimeSformer recording (not shared): 216.6 ms a step of "Python outside any op" while the
device idled, with the fix "profile with with_stack=True" although the trace had its stacks; they named
transformers' normalize, rescale and read_video_pyav (the video's preparation, in the step's process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.python_frames import frame_label, sampled_path, sampled_spot, spot_and_caller, user_frames
from orchestrator.models.analysis import Finding, OpStat, RankSummary
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from orchestrator.traces.loader import PYTHON_FRAME, Span
from tests.support.realtraces import finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

SAMPLED_LOOP = "train.py(5): loop"


def _frame(name: str, ts: float, dur: float) -> dict[str, Any]:
    return x_event(name, ts, dur, cat="python_function")


def _step(tmp_path: Path, frames: list[dict[str, Any]]) -> tuple[RankSummary, Finding]:
    """A 1 ms step whose device runs 0.3 ms: idle from 110 µs to 731 µs while the host is in no op, in ``frames``."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1, dur=5), kernel(10, 100, 1),
        launch(725, 2, dur=5), kernel(731, 200, 2),
        *frames,
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    summary = analyze_folder(tmp_path)
    return summary.ranks[0], finding(summary, "low_gpu_utilization")


def _python(rank: RankSummary) -> dict[str, float]:
    assert rank.idle is not None
    cpu = rank.idle.get("cpu")
    assert cpu is not None
    return {f.name: round(f.total_ms * 1000) for f in cpu.python_frames}  # µs


def test_python_outside_any_op_is_named_by_its_innermost_frame_of_the_users_code(tmp_path: Path) -> None:
    rank, _ = _step(tmp_path, [_frame("train.py(12): train_step", 0, 1000), _frame("data/augment.py(30): random_crop", 120, 600)])
    assert _python(rank) == {"data/augment.py(30): random_crop": 600, "train.py(12): train_step": 84}


def test_torch_numpy_and_the_standard_librarys_frames_are_named_by_their_caller(tmp_path: Path) -> None:
    rank, _ = _step(
        tmp_path,
        [
            _frame("data/augment.py(30): random_crop", 110, 615),
            _frame("torch/nn/functional.py(4500): pad", 200, 100),
            _frame("numpy/_core/fromnumeric.py(2300): clip", 320, 100),
            _frame("threading.py(300): wait", 450, 100),
        ],
    )
    assert _python(rank) == {"data/augment.py(30): random_crop": 615}


def test_builtins_and_frames_shorter_than_50_us_are_dropped_at_load(tmp_path: Path) -> None:
    rank, _ = _step(
        tmp_path,
        [
            _frame("data/augment.py(30): random_crop", 110, 615),
            _frame("<built-in method tolist of Tensor object at 0x7f>", 200, 300),
            _frame("data/augment.py(80): _jitter", 600, 40),
        ],
    )
    assert _python(rank) == {"data/augment.py(30): random_crop": 615}


def test_the_datas_preparation_in_the_steps_process_is_told_dataloader_workers(tmp_path: Path) -> None:
    _, top = _step(tmp_path, [_frame("transformers/image_transforms.py(390): normalize", 110, 615)])
    assert top.fix.startswith("Python functions (normalize (transformers/image_transforms.py:390) 0.6 ms) run outside any op")
    assert "DataLoader workers" in top.fix and "with_stack=True" not in top.fix


def test_numpy_image_transforms_are_told_the_image_processors_torchvision_backend(tmp_path: Path) -> None:
    # transformers/image_transforms.py is the numpy path of an image processor (normalize, rescale per image).
    _, top = _step(tmp_path, [_frame("transformers/image_transforms.py(390): normalize", 110, 615)])
    assert "Much of that time is the model's image processor, image by image off torch" in top.fix
    assert "AutoImageProcessor.from_pretrained(name, backend='torchvision')" in top.fix and "image_processor=" not in top.fix


def test_a_pipelines_preprocessing_is_told_the_pipelines_num_workers(tmp_path: Path) -> None:
    # The TimeSformer recording: a video-classification pipeline decodes and normalizes each clip in the step.
    frames = [
        _frame("transformers/pipelines/video_classification.py(174): read_video_pyav", 110, 300),
        _frame("transformers/image_transforms.py(390): normalize", 420, 300),
    ]
    _, top = _step(tmp_path, frames)
    assert "a transformers pipeline's preprocessing, in the step's own process: call the pipeline on a dataset or list" in top.fix
    assert "pipe(inputs, num_workers=8, batch_size=16)" in top.fix and "given to the pipeline as image_processor=" in top.fix
    assert "Dataset's __getitem__" not in top.fix


def test_bookkeeping_every_step_is_told_every_n_steps(tmp_path: Path) -> None:
    _, top = _step(tmp_path, [_frame("trainer_callback.py(455): on_step_end", 110, 615)])
    assert "on_step_end (trainer_callback.py:455)" in top.fix and "every N steps" in top.fix


def test_other_python_is_told_to_leave_the_step_or_become_tensor_ops(tmp_path: Path) -> None:
    _, top = _step(tmp_path, [_frame("model/router.py(88): assign_experts", 110, 615)])
    assert "assign_experts (model/router.py:88)" in top.fix and "tensor ops" in top.fix


@pytest.mark.parametrize(
    ("frame", "told"),
    [
        ("data/pipeline.py(20): _preprocess_image", "DataLoader workers"),
        ("torchvision/transforms/v2/_geometry.py(50): forward", "DataLoader workers"),
        ("train.py(70): log_metrics", "every N steps"),
        ("transformers/trainer.py(3100): save_pretrained", "every N steps"),
        ("model/heads.py(12): compute_logits", "tensor ops"),  # "log" inside a word is no logging
        ("runner.py(9): spawn_thread_pool", "tensor ops"),  # nor "read_" inside "thread_"
    ],
)
def test_the_fix_follows_whole_words_of_the_functions_names(tmp_path: Path, frame: str, told: str) -> None:
    _, top = _step(tmp_path, [_frame(frame, 110, 615)])
    assert told in top.fix


def test_the_largest_function_decides_the_fix_not_a_small_one_named_beside_it(tmp_path: Path) -> None:
    _, top = _step(tmp_path, [_frame("model/loss.py(5): compute_loss", 110, 500), _frame("data/batch.py(3): pad_batch", 610, 115)])
    assert "compute_loss (model/loss.py:5) 0.5 ms, pad_batch (data/batch.py:3) 0.1 ms" in top.fix
    assert "tensor ops" in top.fix and "DataLoader workers" not in top.fix


def test_without_stacks_the_fix_says_how_to_find_out(tmp_path: Path) -> None:
    rank, top = _step(tmp_path, [])
    assert _python(rank) == {}
    assert "with_stack=True" in top.fix


def test_a_frame_label_puts_the_function_first_so_a_cut_keeps_it() -> None:
    assert frame_label("transformers/image_transforms.py(390): normalize") == "normalize (transformers/image_transforms.py:390)"
    assert frame_label("nn.Module: Linear_0") == "nn.Module: Linear_0"


def test_installed_packages_are_named_by_their_package_and_the_users_absolute_paths_kept() -> None:
    names = [
        "/venv/lib/python3.11/site-packages/PIL/Image.py(2200): resize",
        "/venv/lib/python3.11/site-packages/torch/_ops.py(1244): __call__",
        "/usr/lib/python3.11/json/decoder.py(337): decode",
        "/home/me/project/train.py(45): step",
    ]
    kept = user_frames(Span(float(i), float(i + 1), name, PYTHON_FRAME, 1, 1) for i, name in enumerate(names))
    assert [s.name for s in kept] == [names[0], names[3]]


@given(st.text(max_size=200))
def test_any_frame_name_gets_a_label_and_a_verdict(name: str) -> None:
    label = frame_label(name)
    assert isinstance(label, str) and (label or not name)
    assert len(user_frames([Span(0.0, 1.0, name, PYTHON_FRAME, 1, 1)])) in (0, 1)


def test_with_stacks_python_no_frame_names_is_not_told_to_turn_stacks_on(tmp_path: Path) -> None:
    # Stacks were on (a frame of the user's code names part of the time); the rest runs in torch's own frames only.
    _, top = _step(tmp_path, [_frame("train.py(12): log_metrics", 110, 100), _frame("torch/autograd/graph.py(800): _engine_run", 300, 420)])
    assert top.fix.startswith("The host runs code the profiler does not name while the device idles (0.6 ms per step): wrap")
    assert "with_stack=True" not in top.fix


def test_idle_time_other_findings_claim_leaves_no_fix_for_what_is_spread_thin(tmp_path: Path) -> None:
    # TraceLens' H100 OWLv2 recording: the DataLoader finding claims 619 ms of 644 ms idle a step; the rest is spread
    # over causes under 1% of the step. Before, the utilization line told "profile with with_stack=True".
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 595),
        launch(595, 1, dur=5), kernel(601, 399, 1),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    summary = analyze_folder(tmp_path)
    assert summary.findings[0].code == "dataloader_bound"
    low = finding(summary, "low_gpu_utilization")
    assert low.severity == "info" and low.fix.startswith("The idle time no other finding claims is spread over small causes")

def test_a_functions_samples_at_different_lines_are_one_step_of_the_hot_path():
    stacks = [[f"train.py({line}): weights", "train.py(30): step", SAMPLED_LOOP] for line in (11, 12, 12, 13)]
    path = sampled_path(stacks, share=0.5, interval_ms=5)
    assert [(f.name, f.calls) for f in path] == [(SAMPLED_LOOP, 4), ("train.py(30): step", 4), ("train.py(12): weights", 4)]


def test_a_comprehension_is_named_by_its_function():
    path = [OpStat(name=n, calls=4, total_ms=20.0) for n in (SAMPLED_LOOP, "tok.py(2): tokenize", "tok.py(3): <listcomp>")]
    spot, caller = spot_and_caller(path)
    assert spot.name == "tok.py(2): tokenize" and caller is not None and caller.name == SAMPLED_LOOP


def test_a_share_of_a_few_stack_samples_is_said_as_a_count():
    # One 5 ms sample in a 3 ms span read "100% in _do_all_reduce": no proportion of anything.
    path = [OpStat(name=n, calls=1, total_ms=5.0) for n in (SAMPLED_LOOP, "dist.py(9): _do_all_reduce")]
    assert sampled_spot(path, 1).startswith("1 of 1 in _do_all_reduce (dist.py:9)")
    many = [f.model_copy(update={"calls": 4}) for f in path]
    assert sampled_spot(many, 5).startswith("80% in _do_all_reduce (dist.py:9)")


def test_a_long_label_leaves_out_the_paths_middle_folders_not_the_files_name():
    # Cut at 90 characters, the reader of Lightning's SIGTERM broadcast read "(lightning/pytorch/loops/training_epoch_loop."
    name = "lightning/pytorch/loops/training_epoch_loop.py(269): _TrainingEpochLoop._broadcast_sigterm_tensor"
    assert frame_label(name, 90) == "_TrainingEpochLoop._broadcast_sigterm_tensor (lightning/.../training_epoch_loop.py:269)"
    assert frame_label("train.py(5): loop", 90) == "loop (train.py:5)"


@given(st.text(max_size=300), st.integers(min_value=1, max_value=200))
def test_a_label_never_exceeds_its_width(name: str, width: int):
    assert len(frame_label(name, width)) <= width


def test_a_method_defined_inside_a_function_is_labelled_by_its_class_and_name():
    label = frame_label("record.py(245): lightning_parts.<locals>.Module.validation_step")
    assert label == "Module.validation_step (record.py:245)"


def _sampled_step(tmp_path: Path, stacks: list[list[str]]) -> tuple[RankSummary, Finding]:
    """A 20 ms step whose device runs 2 kernels and idles from 1.01 ms to 19 ms while the host is in no op (but for the 5 µs launch), with one
    stack sample in ``stacks`` every 5 ms from 3 ms, as the agent writes them (no with_stack)."""
    base_us = 1_700_000_000_000_000
    events = [
        x_event("ProfilerStep#1", 0, 20_000, cat="user_annotation"),
        launch(0, 1, dur=5), kernel(10, 1_000, 1),
        launch(18_995, 2, dur=5), kernel(19_000, 900, 2),
    ]
    samples = FrameSamples(
        interval_ms=5, stacks=stacks, samples=[(base_us + 3_000 + 5_000 * k, k % len(stacks)) for k in range(4)]
    )
    write_trace(
        tmp_path / "rank0.pt.trace.json", events, world_size=1, baseTimeNanoseconds=base_us * 1000,
        **{FRAMES_METADATA_KEY: samples.model_dump(mode="json")},
    )
    summary = analyze_folder(tmp_path)
    return summary.ranks[0], finding(summary, "low_gpu_utilization")


def test_the_stack_samples_name_the_python_that_leaves_the_device_idle_without_with_stack(tmp_path: Path) -> None:
    rank, found = _sampled_step(tmp_path, [["data/augment.py(30): random_crop", "train.py(12): train_step", "train.py(40): main"]])
    assert _python(rank) == {"data/augment.py(30): random_crop": 17_985}
    assert "random_crop (data/augment.py:30)" in found.fix and "with_stack=True" not in found.fix


def test_samples_under_torch_name_their_nearest_frame_of_the_users_code(tmp_path: Path) -> None:
    stacks = [["torch/nn/functional.py(4500): pad", "data/augment.py(30): random_crop", "train.py(12): train_step"]]
    rank, _ = _sampled_step(tmp_path, stacks)
    assert _python(rank) == {"data/augment.py(30): random_crop": 17_985}
