"""skorch's NeuralNet, unmodified (tests/data/record_cpu_skorch.py, skorch 1.4.0 on torch 2.13.0+cpu): an MLP fitted by
NeuralNetClassifier with AdamW on one CPU thread. skorch steps every optimizer with a closure, so forward and backward
run inside Optimizer.step, and it records each batch's loss in its history as a Python number."""

from __future__ import annotations

import functools

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.loops import Loop
from tests.support.realtraces import finding, only_rank
from tests.support.tracefiles import case


@functools.cache
def skorch(name: str) -> Summary:
    return analyze_folder(case(f"cpu_{name}"))


def test_the_trace_says_skorchs_neuralnet_runs_the_loop() -> None:
    assert only_rank(skorch("skorch")).loop is Loop.SKORCH  # the agent's word, from its hook's stack
    assert only_rank(skorch("skorch_stacks")).loop is Loop.SKORCH  # from the with_stack frames alone


def test_the_closures_forward_and_backward_are_not_the_optimizers_time() -> None:
    # optimizer.step(step_fn): the model's forward and backward run inside Optimizer.step#AdamW.step; filed by name
    # order, as before issue 29, both read 0 ms and the optimizer held them.
    for name in ("skorch", "skorch_stacks"):
        phases = only_rank(skorch(name)).mean_phases
        assert phases.forward > 0.5 and phases.backward > 0.5


def test_skorchs_read_of_each_batchs_loss_is_named_its_own_with_no_setting() -> None:
    read = finding(skorch("skorch_stacks"), "host_sync")
    assert read.fix.startswith("The reads are mostly in run_single_epoch (skorch/net.py:")
    assert "skorch's NeuralNet records every batch's loss in net.history" in read.fix
    assert "no setting skips it" in read.fix and "start there" not in read.fix
