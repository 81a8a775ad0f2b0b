"""OpenMMLab MMEngine's Runner, unmodified (tests/data/record_cpu_mmengine.py, MMEngine 0.10.7 on torch 2.13.0+cpu): an
MLP in a BaseModel returning two loss terms, on two gloo ranks under MMEngine's DDP wrapper, and one rank with stacks.
Its train_step runs the model's data preprocessor on each batch before the model, and its RuntimeInfoHook turns each
returned value into a Python number after every iteration."""

from __future__ import annotations

import functools

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.analysis.step_content import one_step
from orchestrator.loops import Loop
from tests.support.realtraces import finding
from tests.support.tracefiles import case


@functools.cache
def mmengine(name: str) -> Summary:
    return analyze_folder(case(f"cpu_mmengine_{name}"))


def test_the_trace_says_mmengines_runner_runs_the_loop() -> None:
    assert {r.loop for r in mmengine("ddp").ranks} == {Loop.MMENGINE}  # the agent's word, from its hook's stack
    assert mmengine("stacks").ranks[0].loop is Loop.MMENGINE  # from the with_stack frames alone


def test_the_data_preprocessor_is_no_forward_pass_of_the_model() -> None:
    # Before: "2 forward passes (BaseDataPreprocessor_0 ×1, Classifier_0 ×1)".
    assert one_step(mmengine("stacks")).startswith("One step (as the trace shows): AdamW.step ×1; 1 forward pass (Classifier_0).")


def test_the_hooks_reads_of_each_loss_term_are_named_mmengines_with_no_setting() -> None:
    # Three reads a step (the sum parse_losses adds and the two terms), in RuntimeInfoHook.after_train_iter: before,
    # "start there" in MMEngine's own file.
    read = finding(mmengine("stacks"), "host_sync")
    assert read.fix.startswith("The reads are mostly in after_train_iter (mmengine/hooks/runtime_info_hook.py:")
    assert "MMEngine's RuntimeInfoHook turns every value the model's train_step returns" in read.fix
    assert "no setting skips them" in read.fix and "start there" not in read.fix


def test_ddps_exposed_all_reduce_is_told_mmengines_accumulation_setting() -> None:
    fix = finding(mmengine("ddp"), "comm_exposed").fix
    assert "In MMEngine's Runner: optim_wrapper=dict(..., accumulative_counts=N)" in fix
