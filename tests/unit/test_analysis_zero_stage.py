"""A DeepSpeed engine's ZeRO stage, read from the frames of its gradients' reduction, decides what its communication
fix says (tests/data/record_cpu_deepspeed.py: two gloo ranks, an 8.4 M-parameter MLP of nine layers, gradient
accumulation 2, the agent's stack samples every millisecond; DeepSpeed 0.19.8's default reduce_bucket_size of 5e8
elements)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.accumulation import Rounds, accumulation_fix, early_rounds
from orchestrator.analysis.comm_fix import own_fix
from orchestrator.loops import METADATA_KEY
from tests.support.tracefiles import case, with_header

ALLREDUCE_BUCKET = "deepspeed/runtime/zero/stage_1_and_2.py(2384): DeepSpeedZeroOptimizer.allreduce_bucket"


def _comm_fix(tmp_path: Path, name: str) -> str:
    """The communication finding's fix of the recorded ``name``, as the agent's word (a DeepSpeed loop) makes it."""
    summary = analyze_folder(with_header(tmp_path, name, **{METADATA_KEY: "deepspeed"}))
    (found,) = [f for f in summary.findings if f.code == "comm_exposed"]
    return found.fix


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_zero_stage_is_read_from_the_frames_of_the_engines_reduction(stage):
    summary = analyze_folder(case(f"cpu_deepspeed_zero{stage}"))
    assert [(r.zero_stage, r.zero_bf16_optimizer) for r in summary.ranks] == [(stage, False)] * 2


def test_bf16_with_fp32_gradient_accumulation_is_read_as_bf16_optimizer_not_as_no_zero():
    # Stage 1 with bf16 weights and fp32 gradient accumulation runs BF16_Optimizer, which reduces through the engine's
    # own all-reduce: read by that call alone, it was stage 0 ("without ZeRO").
    summary = analyze_folder(case("cpu_deepspeed_zero1_bf16"))
    assert [(r.zero_stage, r.zero_bf16_optimizer) for r in summary.ranks] == [(None, True)] * 2


def test_bf16_optimizer_is_told_that_its_buckets_change_nothing_and_stage_2_does(tmp_path):
    # Measured on DeepSpeed 0.19.8: BF16_Optimizer reduces after backward with overlap_comm and a 5,000-element bucket
    # alike; stage 2 with them reduces during backward.
    for r in analyze_folder(with_header(tmp_path, "cpu_deepspeed_zero1_bf16", **{METADATA_KEY: "deepspeed"})).ranks:
        fix = own_fix(r)
        assert fix is not None and "through its BF16_Optimizer" in fix
        assert '"zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": N}' in fix
        assert "without ZeRO" not in fix and '"stage": 1' not in fix


def test_a_trace_without_stacks_tells_no_stage():
    assert [r.zero_stage for r in analyze_folder(case("cpu_deepspeed_comm")).ranks] == [None, None]


def test_deepspeeds_collectives_are_named_by_the_frame_that_asked_for_them_not_by_its_wrappers():
    # Before: "made in TorchBackend.all_reduce (deepspeed/comm/torch.py:290)", DeepSpeed's wrapper of torch.distributed.
    for r in analyze_folder(case("cpu_deepspeed_zero2")).ranks:
        assert r.own_comm_callers[0].name == ALLREDUCE_BUCKET


def test_a_zero_2_engine_reducing_after_backward_is_told_its_bucket_size_not_to_move_to_stage_2(tmp_path):
    # Before: every DeepSpeed job was told '"stage": 2, "overlap_comm": true, "contiguous_gradients": true', which
    # this job runs but for overlap_comm; with the default bucket its gradients all wait for the end of backward
    # (measured on DeepSpeed 0.19.8: overlap_comm alone moves no reduction into backward, a bucket below the
    # parameter count does).
    fix = _comm_fix(tmp_path, "cpu_deepspeed_zero2")
    assert "made in DeepSpeedZeroOptimizer.allreduce_bucket" in fix
    assert "reducing the gradients of every micro-batch at ZeRO stage 2" in fix
    assert "Stage 1 reduces once per accumulated step" in fix
    assert '"overlap_comm": true, "reduce_bucket_size": N' in fix and "contiguous_gradients" not in fix


def test_a_zero_1_engine_is_told_to_reduce_buckets_during_backward(tmp_path):
    fix = _comm_fix(tmp_path, "cpu_deepspeed_zero1")
    assert "reducing the gradients once per step at ZeRO stage 1" in fix
    assert '"overlap_comm": true, "reduce_bucket_size": N' in fix


def test_an_engine_without_zero_is_told_that_it_always_reduces_after_backward(tmp_path):
    # Its collectives stay under the communication finding's bar on this recording: the fix they would be told.
    for r in analyze_folder(with_header(tmp_path, "cpu_deepspeed_zero0", **{METADATA_KEY: "deepspeed"})).ranks:
        fix = own_fix(r)
        assert fix is not None and "without ZeRO it always reduces them after backward" in fix
        assert '"zero_optimization": {"stage": 1, "overlap_comm": true' in fix


def test_the_bucket_size_it_is_told_moves_the_engines_reduction_into_backward():
    # The same job with "overlap_comm": true, "reduce_bucket_size": 2e6 (a quarter of its 8.4 M gradients): its
    # reductions but the last bucket's now run inside backward, in the gradients' hooks.
    before = analyze_folder(case("cpu_deepspeed_zero2")).ranks
    after = analyze_folder(case("cpu_deepspeed_zero2_buckets")).ranks
    for b, a in zip(before, after, strict=True):
        assert b.own_comm is not None and a.own_comm is not None
        assert a.own_comm.total_ms < b.own_comm.total_ms / 2
        assert a.mean_phases.backward > b.mean_phases.backward


def test_a_zero_2_engine_that_reduces_in_backward_is_not_told_to_accumulate_what_it_accumulates(tmp_path):
    # Stage 2 reduces every micro-batch's gradients by design: before, the engine was to be "told how many
    # micro-batches make a step", which it was. (Its early rounds cost 5% of this recording's step: the fix they get.)
    for r in analyze_folder(with_header(tmp_path, "cpu_deepspeed_zero2_buckets", **{METADATA_KEY: "deepspeed"})).ranks:
        rounds = early_rounds(r)
        assert rounds == Rounds(passes=2, reducing=2, early=1)
        fix = accumulation_fix(r, rounds)
        assert fix.startswith("ZeRO stage 2 reduces the gradients of each of the 2 micro-batches")
        assert "tell it how many micro-batches make a step" not in fix


def test_a_zero_3_engines_all_reduces_after_backward_are_told_as_what_it_computes_over_the_gradients(tmp_path):
    # They stay under the communication finding's bar here (its gathers lead): the fix they would be told.
    for r in analyze_folder(with_header(tmp_path, "cpu_deepspeed_zero3", **{METADATA_KEY: "deepspeed"})).ranks:
        fix = own_fix(r)
        assert fix is not None and "once ZeRO stage 3 has reduce-scattered them during backward" in fix
        assert "reduce_bucket_size" not in fix


def test_a_zero_3_engines_gathers_are_told_its_prefetch_settings(tmp_path):
    fix = _comm_fix(tmp_path, "cpu_deepspeed_zero3")
    assert fix.startswith("Parameters are gathered and gradients reduce-scattered (FSDP, ZeRO-3)")
    assert fix.endswith(
        'In DeepSpeed: "zero_optimization": {"stage3_prefetch_bucket_size": N, "stage3_param_persistence_threshold": '
        "N}: the parameters of the next modules gathered during the current ones' compute, and those smaller than the "
        "threshold kept whole on every rank (no gather at all)."
    )



def test_a_deepspeed_engine_under_a_transformers_trainer_is_told_deepspeeds_keys(tmp_path):
    # The Trainer owns the loop (given a DeepSpeed config), the engine reduces: its frames show it, its keys apply.
    summary = analyze_folder(with_header(tmp_path, "cpu_deepspeed_zero2", **{METADATA_KEY: "transformers_trainer"}))
    (found,) = [f for f in summary.findings if f.code == "comm_exposed"]
    assert "reducing the gradients of every micro-batch at ZeRO stage 2" in found.fix
    assert "DDP or FSDP" not in found.fix and "ddp_bucket_cap_mb" not in found.fix
