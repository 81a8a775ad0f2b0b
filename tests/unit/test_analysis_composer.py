"""MosaicML Composer's Trainer, unmodified (tests/data/record_cpu_composer.py, Composer 0.32.1 on torch 2.13.0+cpu): an
MLP in a ComposerClassifier on two gloo ranks, with its default training metric and without, and one rank with
stacks. Composer computes the training metrics after every batch, and torchmetrics gathers their state from every rank
at each compute(); it also makes five small collectives of its own a batch and reads their results back."""

from __future__ import annotations

import functools

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.loops import Loop
from tests.support.realtraces import codes, finding
from tests.support.tracefiles import case


@functools.cache
def composer(name: str) -> Summary:
    return analyze_folder(case(f"cpu_composer_{name}"))


def test_the_trace_says_composers_trainer_runs_the_loop() -> None:
    assert {r.loop for r in composer("ddp").ranks} == {Loop.COMPOSER}
    assert composer("stacks").ranks[0].loop is Loop.COMPOSER  # from its with_stack frames: no word from the agent


def test_training_metrics_gathered_every_batch_are_told_as_composers_setting() -> None:
    # MulticlassAccuracy, ComposerClassifier's default: compute() after every batch gathers its state from both ranks.
    # Before: "Keep dist_sync_on_step=False (the default) and call compute() once per epoch", which Composer does not
    # let its user do.
    summary = composer("ddp")
    assert codes(summary)[0] == "comm_exposed"
    fix = summary.findings[0].fix
    assert "Composer's Trainer computes every training metric after every batch" in fix
    assert "ComposerClassifier(..., train_metrics=MetricCollection([]))" in fix
    assert "dist_sync_on_step" not in fix


def test_without_training_metrics_no_metric_state_is_gathered_and_none_is_told() -> None:
    # The same job given ComposerClassifier(..., train_metrics=MetricCollection([])): only all-reduces are left (DDP's
    # and Composer's own), and the fix is DDP's, in Composer's setting.
    summary = composer("ddp_no_train_metrics")
    for rank in summary.ranks:
        assert rank.own_comm is not None and rank.own_comm.name == "c10d::allreduce_"
    fix = finding(summary, "comm_exposed").fix
    assert "training metric" not in fix
    assert "In Composer's Trainer: Trainer(device_train_microbatch_size=N)" in fix


def test_composers_own_reads_are_named_its_own_with_no_setting() -> None:
    # Seven reads a batch in five of Composer's functions (its closure's included), none holding half: before, the
    # fix named none of them and told the job to keep loss.item() off its per-step path, as if it had written them.
    [read] = composer("stacks").findings
    assert read.code == "host_sync"
    assert {c.name.split(": ")[1] for c in composer("stacks").ranks[0].sync_callers} >= {
        "_accumulate_time_across_ranks", "_iter_dataloader", "_train_microbatches", "<lambda>",
    }
    assert read.fix.startswith("Composer's Trainer reads seven values back every batch itself")
    assert "No Trainer setting skips them" in read.fix and "start there" not in read.fix


def test_what_composers_closure_runs_after_backward_is_not_optimizer_time() -> None:
    # Composer steps AdamW with a closure by default; after backward the closure updates the training metric and
    # reads the loss back. Before: optimizer 4.9 ms, other 1.7 ms a step (the AdamW update itself is 3.2 ms of it).
    phases = composer("stacks").ranks[0].mean_phases
    assert phases.optimizer < 3.5 and phases.other > 3.0
