"""A CPU-only step that spends its time in the training loop's own Python, outside torch, named from the agent's
stack samples.

Recorded by tests/data/record_ray_loops.py (Ray Train on a local Ray, the agent's sampler in each trace):
cpu_python_weights (two DDP workers computing per-sample loss weights in a Python loop, ~23 ms of a 30 ms step)
cpu_python_tokenize (one worker tokenizing each batch of strings in the step with a tokenizer written in Python) and
cpu_hf_tokenize (the same with a transformers fast tokenizer); cpu_rank0_metrics (two DDP workers, rank 0 alone
computing statistics for a log line in Python after each step, the other waiting in the next all-reduce); cpu_ray_get
(one worker calling ray.get on an actor every step, the actor taking 20 ms).
Before this rule the Python read as the model's forward, and the report said "No findings".
"""

from __future__ import annotations

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.data_fix import prep_clause
from orchestrator.analysis.untraced import Untraced, sample_kind
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from tests.support.tracefiles import case, write_trace, x_event

LOOP = "train.py(5): loop"


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_a_python_loop_in_the_step_is_the_first_finding_named_by_its_function():
    summary = analyze_folder(case("cpu_python_weights"))
    found = summary.findings[0]
    assert found.code == "host_python" and found.severity == "warning"
    assert found.ranks == [0, 1]
    assert "in _sample_weights (record_ray_loops.py:" in found.evidence


def test_on_an_h200_the_python_the_device_waits_for_is_named_from_the_samples_alone():
    # The device check's CNN whose training thread scores a million values in a Python loop before each step, no
    # with_stack (benchmarks/results/gpu-h200-run5.json): on a device the device idle finding tells it, by name.
    summary = analyze_folder(case("h200_python_bound"))
    first = summary.findings[0]
    assert first.code == "low_gpu_utilization" and first.severity == "warning"
    assert first.fix.startswith("Python functions (_score_labels (benchmarks/gpu_driver.py:135)")
    assert "move that work off the step" in first.fix
    assert finding(summary, "host_python") is None  # one finding for the time, not two


def test_the_loops_own_python_is_not_the_models_forward():
    summary = analyze_folder(case("cpu_python_weights"))
    for r in summary.ranks:
        python = sum(s.python_ms for s in r.steps) / len(r.steps)
        assert python > 0.5 * r.mean_step_ms
        assert r.mean_phases.forward < 0.2 * r.mean_step_ms and r.mean_phases.other >= python
        assert r.mean_phases.total() == pytest.approx(r.mean_step_ms, rel=1e-6)


def test_python_that_visits_elements_one_by_one_is_told_to_become_tensor_ops():
    found = finding(analyze_folder(case("cpu_python_weights")), "host_python")
    assert "as tensor ops over the whole batch" in found.fix
    assert "Dataset's __getitem__" not in found.fix


def test_a_tokenizer_run_in_the_step_is_told_to_move_into_dataloader_workers():
    found = finding(analyze_folder(case("cpu_python_tokenize")), "host_python")
    assert found.severity == "warning"
    assert "in _tokenize (record_ray_loops.py:" in found.evidence and "after its batch is fetched" in found.evidence
    assert "<listcomp>" not in found.evidence + found.fix
    assert "Dataset's __getitem__ so DataLoader workers (num_workers > 0)" in found.fix


def test_a_wait_for_a_ray_call_is_told_to_start_the_call_a_step_ahead():
    found = finding(analyze_folder(case("cpu_ray_get")), "host_python")
    assert found.title.startswith("Waiting for Ray calls takes") and found.severity == "warning"
    assert "in Worker.get_objects (ray/_private/worker.py:" in found.evidence
    assert "submit it a step ahead and get the previous call's result" in found.fix and "tensor ops" not in found.fix


def test_the_samples_path_begins_at_the_loops_line_that_calls_the_work():
    # The loop's own frame is in every sample; its line that calls ray.get is in these alone.
    found = finding(analyze_folder(case("cpu_ray_get")), "host_python")
    assert "under _asks_an_actor_every_step (record_ray_loops.py:" in found.evidence


def test_a_straggler_running_python_the_others_do_not_is_told_which_function():
    found = finding(analyze_folder(case("cpu_rank0_metrics")), "straggler")
    assert found.ranks == [0] and found.title == "Rank 0 is a straggler (other)"
    assert "in the loop's own Python, which the other ranks do not run: 100% in _sample_weights" in found.evidence
    assert ", under " in found.evidence  # the loop's line that calls it
    assert found.fix.startswith("_sample_weights (record_ray_loops.py:") and "runs on rank 0 alone" in found.fix


def test_a_stragglers_own_python_is_told_by_the_straggler_finding_alone():
    summary = analyze_folder(case("cpu_rank0_metrics"))
    assert finding(summary, "straggler") is not None and finding(summary, "host_python") is None


def test_a_line_of_the_loop_itself_is_not_told_to_become_tensor_ops_alone(tmp_path):
    # 80 ms of each 100 ms step at the loop's own line 40 (a sleep, a C call): no deeper frame to name.
    found = finding(_loop_line_trace(tmp_path), "host_python")
    assert "The stack samples there: 100% in train_loop (train.py:40)" in found.evidence
    assert "a line of the loop itself, running no torch op: what it calls there (a sleep" in found.fix


def test_a_transformers_tokenizer_run_in_the_step_is_told_to_tokenize_once_ahead():
    found = finding(analyze_folder(case("cpu_hf_tokenize")), "host_python")
    assert found.severity == "warning"
    assert "TokenizersBackend._encode_plus (transformers/tokenization_utils_tokenizers.py:" in found.evidence
    assert "tokenize once, ahead (datasets' map(tokenize, batched=True, num_proc=N))" in found.fix
    assert "use_fast=True" not in found.fix  # it is the fast tokenizer already


def test_a_slow_tokenizer_is_told_to_use_the_fast_one():
    clause = prep_clause(["transformers/tokenization_python.py(700): PythonBackend._tokenize"], pipeline=False, device="cpu")
    assert "tokenize once, ahead" in clause and "use_fast=True" in clause


_PIL_DECODE = ["PIL/ImageFile.py(300): ImageFile.load", "torchvision/datasets/folder.py(260): pil_loader"]


def test_pil_decoding_on_a_cuda_rank_is_told_to_decode_on_the_gpu():
    clause = prep_clause(_PIL_DECODE, pipeline=False, device="cuda")
    assert "decode on the GPU (torchvision.io.decode_jpeg(data, device='cuda'))" in clause


def test_pil_decoding_on_an_intel_gpu_is_told_to_transform_there_not_to_decode_on_cuda():
    # torchvision decodes JPEGs on CUDA devices only; its tensor transforms run on any.
    clause = prep_clause(_PIL_DECODE, pipeline=False, device="xpu")
    assert "transform the tensors on the XPU (torchvision.transforms.v2)" in clause
    assert "cuda" not in clause


@pytest.mark.parametrize("folder", ["cpu_ray_data_fast", "cpu_hf_trainer_save_sampled", "cpu_lightning_validate_sampled"])
def test_frameworks_own_loops_with_samples_get_no_python_finding(folder):
    # A Trainer's and Lightning's own Python between the batch and the backward is a few percent of their steps.
    assert finding(analyze_folder(case(folder)), "host_python") is None


def test_a_sample_under_no_torch_frame_is_the_loops_own_python():
    assert sample_kind(["tok.py(3): <listcomp>", "tok.py(2): tokenize", LOOP]) is Untraced.PYTHON
    assert sample_kind(["numpy/core/fromnumeric.py(59): _wrapfunc", "train.py(9): weights", LOOP]) is Untraced.PYTHON


def test_a_sample_under_a_torch_frame_is_torchs_not_the_loops():
    assert sample_kind(["torch/nn/modules/module.py(1789): _call_impl", LOOP]) is None
    assert sample_kind(["mylib/loss.py(4): hook", "torch/autograd/__init__.py(395): backward", LOOP]) is None


def test_a_sample_in_ray_data_is_ray_datas_not_the_loops():
    assert sample_kind(["ray/data/iterator.py(293): _create_iterator", LOOP]) is Untraced.RAY_DATA


def _loop_line_trace(tmp_path):
    """Two 100 ms steps on one rank: torch ops from 0 to 10 and 90 to 100 ms of each, the loop at its line 40 between
    them (a stack sample every 5 ms there, and at line 38 in the ops)."""
    base_us = 1_700_000_000_000_000
    events, samples = [], []
    for k in range(2):
        t = k * 100_000
        events += [
            x_event(f"ProfilerStep#{k + 1}", t, 100_000, cat="user_annotation"),
            x_event("aten::mm", t, 10_000), x_event("aten::mm", t + 90_000, 10_000),
        ]
        samples += [(base_us + t + 5_000, 1)] + [(base_us + t + ms * 1_000, 0) for ms in range(12, 90, 5)]
    stacks = [["train.py(40): train_loop", "train.py(60): <module>"], ["torch/nn/functional.py(9): linear", "train.py(38): train_loop", "train.py(60): <module>"]]
    header = {FRAMES_METADATA_KEY: FrameSamples(interval_ms=5, stacks=stacks, samples=samples).model_dump(mode="json")}
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1, baseTimeNanoseconds=base_us * 1000, **header)
    return analyze_folder(tmp_path)
