"""Issue 29 on CPU-only traces of training code rayprof did not write (plain torch.profiler, no rayprof in the job):
tests/data/record_cpu_issue29.py recorded them (torch 2.13.0+cpu, transformers 5.24.0, lightning 2.6.6; FSDP2, DDP and
Lightning under DDP on two gloo ranks), and tests/data/record_cpu_loops.py the Keras one (keras 3.15.1). With no
device, a verdict is the host's phase split and a finding only where there is something to change."""

from __future__ import annotations

import functools

import pytest

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.analysis.device_findings import comm_exposed
from orchestrator.loops import Loop
from tests.support.realtraces import codes, only_rank
from tests.support.tracefiles import case


@functools.cache
def cpu_case(name: str) -> Summary:
    return analyze_folder(case(f"cpu_{name}"))


def test_lightnings_progress_bar_reads_are_told_to_log_without_prog_bar() -> None:
    # self.log("loss", loss, prog_bar=True), with_stack=True: Lightning's logger connector reads the value each step.
    # Recorded again without prog_bar=True, or with on_step=False, the steps read nothing (session 49).
    summary = cpu_case("lightning_prog_bar")
    [read] = summary.findings
    assert [(c.name, c.calls) for c in only_rank(summary).sync_callers] == [
        ("lightning/pytorch/trainer/connectors/logger_connector/result.py(470): metrics", 3)
    ]
    assert read.fix.startswith(
        "The reads are mostly in metrics (lightning/pytorch/trainer/connectors/logger_connector/result.py:470) (1x per "
        "step): Lightning turns every value logged with self.log(..., prog_bar=True) into a Python number each step"
    )
    assert "on_step=False" in read.fix


def test_a_grad_scalers_read_of_found_inf_is_told_a_fused_optimizer() -> None:
    # torch.amp.GradScaler.step reads found_inf (item()) to decide whether to skip AdamW's step: one read a step, a
    # sync on a GPU. Before: "1 wait per step (aten::item)" and the loss.item() advice, which the job does not do.
    summary = cpu_case("grad_scaler")
    assert only_rank(summary).grad_scaler and all(s.sync_calls == 1 for s in only_rank(summary).steps)
    [read] = summary.findings
    assert read.fix.startswith(
        "torch.amp.GradScaler reads found_inf back once a step (scaler.step) to decide whether to skip the optimizer "
        "step: with fused=True on AdamW the scaler hands it to the fused kernel"
    )
    assert "with_stack" not in read.fix


def test_a_grad_scaler_with_a_fused_optimizer_reads_nothing_and_gets_no_finding() -> None:
    summary = cpu_case("grad_scaler_fused")
    assert only_rank(summary).grad_scaler and codes(summary) == []


def test_a_plain_loop_with_adam_gets_no_finding() -> None:
    # An MLP over in-memory tensors. Adam(foreach=False) reads each parameter's step count with item() inside
    # Optimizer.step; that count is a CPU tensor even on a GPU, so those reads are no sync. Before: host_sync info,
    # "6 waits per step", saving 0.0 ms.
    summary = cpu_case("mlp")
    assert codes(summary) == []
    assert all(s.sync_calls == 0 for s in only_rank(summary).steps)


def test_hugging_face_trainer_counts_its_own_reads_not_fused_adamw_s() -> None:
    # Trainer on a tiny GPT-2: the fused AdamW reads its 28 step counts inside Optimizer.step (not syncs); the
    # Trainer's loss nan/inf filter (bool(torch.isnan(loss)), bool(torch.isinf(loss))) and a mask check in GPT-2's
    # forward read 3 values a step: syncs on a GPU, an info line here.
    summary = cpu_case("hf_trainer")
    assert all(s.sync_calls == 3 for s in only_rank(summary).steps)
    assert [f.severity for f in summary.findings] == ["info"]


def test_lightning_loop_gets_no_finding() -> None:
    # Lightning (TensorDataset, num_workers=0, Adam): its Adam's step-count reads are no sync. Its in-process loader
    # (per-sample indexing and collate) takes 21% of this step, under the CPU-only DataLoader bar (25%); over five
    # recordings on a shared 2-core host it took 17-26%, so a busier recording may be told its loader, rightly.
    summary = cpu_case("lightning")
    assert codes(summary) == []
    assert 0.15 < only_rank(summary).mean_phases.data / (only_rank(summary).mean_step_ms or 1) < 0.25


def test_heavy_getitem_is_data_bound() -> None:
    summary = cpu_case("data_bound")
    assert codes(summary) == ["dataloader_bound"]
    top = summary.findings[0]
    assert top.severity == "warning" and top.max_saving_fraction > 0.9 and "num_workers" in top.fix


def test_a_host_round_trip_in_a_region_is_a_cpu_info() -> None:
    # .item() and .cpu().numpy() inside record_function("HOST ROUND TRIP"): the user's read stays counted.
    summary = cpu_case("round_trip")
    assert codes(summary) == ["host_sync"]
    assert summary.findings[0].severity == "info" and "CPU-only" in summary.findings[0].evidence
    # Not every read would wait on a GPU: DDP with find_unused_parameters=True reads its CPU map of used
    # parameters once per parameter in backward (17 reads a step in the live Lightning GAN).
    assert "each read of a device tensor waits" in summary.findings[0].evidence
    assert all(s.sync_calls == 1 for s in only_rank(summary).steps)
    # One read is one wait: the aten::_local_scalar_dense inside the aten::item is not a second one (it was listed
    # beside it, its time counted twice).
    assert [(o.name, o.calls) for o in only_rank(summary).sync_ops] == [("HOST ROUND TRIP / aten::item", 3)]


def test_a_read_inside_a_users_region_is_told_by_that_regions_name() -> None:
    # Before, the finding named only aten::item: the user had to find which of their reads it was.
    fix = cpu_case("round_trip").findings[0].fix
    assert fix.startswith("The region 'HOST ROUND TRIP' reads tensor values back to the host 1x per step")


def test_reads_outside_any_region_without_stacks_are_named_by_their_op_and_told_how_to_find_their_line() -> None:
    # The Trainer's reads are all `if tensor:` (bool(torch.isnan(loss)), a mask's .all() in GPT-2's forward).
    # Before: "3 waits per step (aten::item)" and the loss.item() advice alone.
    summary = cpu_case("hf_trainer")
    assert [(o.name, o.calls) for o in only_rank(summary).sync_ops] == [("aten::is_nonzero", 9)]
    fix = summary.findings[0].fix
    assert fix.startswith("aten::is_nonzero (3x per step): a tensor turned into a Python bool (if t:")
    assert fix.endswith("To see which Python line reads, profile with with_stack=True.")
    assert "region" not in fix and "loss.item()" not in fix  # no read of the kind it advises on


def test_the_python_functions_that_read_are_named_from_the_traces_stacks() -> None:
    # The same Trainer recorded with with_stack=True. Before, the finding said "3 waits per step (aten::item)" and
    # told the general advice: the reads are the Trainer's loop (its nan/inf filter) and GPT-2's mask preparation.
    summary = cpu_case("hf_trainer_stacks")
    [read] = summary.findings
    assert read.code == "host_sync" and read.severity == "info"
    assert [(c.name, c.calls) for c in only_rank(summary).sync_callers] == [
        ("transformers/trainer.py(1957): _run_epoch", 6),
        ("transformers/masking_utils.py(735): find_packed_sequence_indices", 3),
    ]
    assert (
        "Made by (Python, innermost frame of your or a library's code): _run_epoch (transformers/trainer.py:1957) 2 a step, "
        "find_packed_sequence_indices (transformers/masking_utils.py:735) 1 a step." in read.evidence
    )


def test_the_trainers_loss_filter_is_told_the_setting_that_removes_its_reads() -> None:
    # Recorded again with logging_nan_inf_filter=False, the two reads under _run_epoch were gone (session 49).
    fix = cpu_case("hf_trainer_stacks").findings[0].fix
    assert fix.startswith("The reads are mostly in _run_epoch (transformers/trainer.py:1957) (2x per step): transformers' Trainer")
    assert "logging_nan_inf_filter=False" in fix and "with_stack" not in fix


def test_ignites_supervised_trainer_is_told_to_return_the_loss_as_a_tensor() -> None:
    # pytorch-ignite 0.5.5's create_supervised_trainer with its defaults: output_transform returns loss.item().
    [read] = cpu_case("ignite_stacks").findings
    assert read.code == "host_sync" and "update (ignite/engine/__init__.py:" in read.evidence
    assert read.fix.startswith("The reads are mostly in update (ignite/engine/__init__.py:")
    assert "output_transform=lambda x, y, y_pred, loss: loss.detach()" in read.fix and "with_stack" not in read.fix


def test_a_per_parameter_adam_is_told_fused_true_for_adam() -> None:
    # 40 tiny Linear layers (80 parameters) under Adam(foreach=False): the optimizer runs ~9 small ops per parameter
    # and takes 58% of the step. Before: no optimizer finding; the first finding was host_sync info for Adam's reads.
    # Then "a fused or foreach optimizer (e.g. torch.optim.AdamW(params, fused=True) ...)", whatever the optimizer.
    summary = cpu_case("optimizer_small")
    assert codes(summary) == ["optimizer_host"]
    top = summary.findings[0]
    assert top.severity == "warning"
    assert top.fix.startswith(
        "Update all parameters in a few ops (Adam): pass fused=True to Adam (torch.optim.Adam(params, fused=True)): one "
        "kernel launch per parameter group in place of its ops per parameter"
    )
    assert top.max_saving_ms == pytest.approx(only_rank(summary).mean_phases.optimizer)


def test_fsdp2_collective_waits_are_communication_not_forward_or_backward() -> None:
    # Two gloo ranks, an MLP of 6 blocks under fully_shard. The host blocks in FSDP's all-gather and reduce-scatter
    # regions while gloo's threads move the data; before, that read as backward (59 ms of 97) and comm was 4.7 ms.
    summary = cpu_case("fsdp2")
    for r in summary.ranks:
        assert r.mean_phases.comm > 0.5 * (r.mean_step_ms or 0) > r.mean_phases.backward
        assert {o.name for o in r.comm_ops} >= {"FSDP::all_gather", "FSDP::post_backward_reduce"}


def test_fsdp2_is_told_its_own_changes_with_the_counts_the_trace_shows() -> None:
    # Per block + root: 7 forward all-gathers, 6 again for backward. Measured on this box: the same job with
    # reshard_after_forward=False ran 70 ms steps, with one unit 58 ms, against 95 ms.
    [finding] = cpu_case("fsdp2").findings
    assert finding.code == "comm_exposed"
    assert "13 all-gathers" in finding.fix and "skips the 6 all-gathers per step that gather parameters again" in finding.fix
    assert "bucket_cap_mb" not in finding.fix


def test_fsdp2_as_one_unit_is_not_told_fewer_units_or_to_keep_parameters_gathered() -> None:
    [finding] = cpu_case("fsdp2_one_unit").findings
    assert finding.fix.startswith("FSDP's collectives do not overlap compute")
    assert "fewer, larger" not in finding.fix and "reshard_after_forward" not in finding.fix


@pytest.mark.parametrize(("case_name", "advice"), [("fsdp2", "prefetch further ahead"), ("fsdp2_one_unit", "gathered as one unit")])
def test_fsdp2_on_a_device_is_told_to_overlap_its_all_gathers(case_name: str, advice: str) -> None:
    # On a GPU FSDP2 overlaps each unit's all-gather with the previous unit's compute (side streams): the change
    # is more overlap, not fewer units.
    ranks = [r.model_copy(update={"device": "cuda"}) for r in cpu_case(case_name).ranks]
    finding = comm_exposed(ranks, [])
    assert finding is not None and advice in finding.fix


def test_a_loader_cost_one_step_carries_is_said_and_does_not_warn() -> None:
    # rayprof's own capture of the Accelerate loop (tests/jobs/foreign_loops.py, 2 ranks, steps 469-471): rank 0's
    # main-process loader takes 25% of the mean step, but 3.8 of its 4.7 ms are the window's first step (its first
    # next() 3.4 ms against 0.25 ms after). Before: a warning, "Data loading takes 25% of the step".
    summary = analyze_folder(case("cpu_accelerate"))
    top = summary.findings[0]
    assert (top.code, top.severity) == ("dataloader_bound", "info")
    assert top.title == "Data loading takes 25% of the step, 80% of it in step 469"
    assert "80% of it is one step's: step 469 has 3.8 ms, the other 2 steps 0.5 ms (median)." in top.evidence
    assert "num_workers" in top.fix


@pytest.mark.parametrize("name", ["cpu_data_bound", "dataloader_bound"])
def test_a_loader_every_step_waits_for_still_warns(name: str) -> None:
    top = analyze_folder(case(name)).findings[0]
    assert (top.code, top.severity) == ("dataloader_bound", "warning")
    assert "one step" not in top.title + top.evidence


def test_a_ddp_jobs_own_per_step_all_reduces_are_told_to_go_together() -> None:
    # Two gloo ranks under DDP that all_reduce the loss and 20 one-element metrics each step, one call each. Before:
    # "DDP already all-reduces the gradients in buckets ... Send fewer bytes per sample: no_sync(), compress the
    # gradients": DDP's own all-reduce is one call a step, inside backward.
    summary = cpu_case("ddp_metrics")
    own = next(r for r in summary.ranks if r.rank == 1).own_comm
    assert own is not None and (own.name, own.calls) == ("c10d::allreduce_", 63)
    [top] = summary.findings
    assert top.code == "comm_exposed"
    assert top.fix.startswith("21 collective calls a step (c10d::allreduce_) run outside forward and backward and hold ")
    assert "reduce them together (torch.stack the values, one all_reduce)" in top.fix
    assert "bucket" not in top.fix and "no_sync" not in top.fix


def test_ddps_own_bucket_all_reduce_runs_inside_backward_and_is_not_the_jobs_own() -> None:
    # The same job without the metrics: DDP's all-reduce runs in the last AccumulateGrad node of backward.
    summary = cpu_case("ddp")
    assert all(r.own_comm is None and r.ddp for r in summary.ranks)
    assert codes(summary) == []


def test_lightnings_wait_in_its_optimizer_step_for_ddps_all_reduce_is_communication() -> None:
    # Lightning under DDP on two gloo ranks: after the closure's backward, Optimizer.step#Adam.step waits in no op
    # while gloo's worker thread all-reduces the gradients. Before, that wait was optimizer time (8.6 and 6.5 ms of
    # optimizer, 1.6 and 3.1 ms of comm); it is communication.
    for r in cpu_case("lightning_ddp").ranks:
        assert r.mean_phases.comm > r.mean_phases.optimizer
        assert r.mean_phases.total() == pytest.approx(r.mean_step_ms, rel=1e-6)


def test_a_step_begun_inside_the_last_optimizer_step_reads_nothing_as_the_optimizers() -> None:
    # prof.step() runs where rayprof's agent runs it, in an optimizer step post-hook inside the Optimizer.step
    # annotation: every step begins a few µs before the last one's optimizer step ends. Before, each read of the
    # step after was named "Optimizer.step#Adam.step / aten::item".
    for r in cpu_case("lightning_ddp").ranks:
        assert [o.name for o in r.sync_ops] == ["aten::item"]


def test_ddps_reads_of_its_map_of_used_parameters_are_no_waits() -> None:
    # DDP(find_unused_parameters=True), a transformers Trainer's default: after backward the reducer reads its CPU
    # map of used parameters (aten::item) right before each parameter's copy_bucket_to_grad, a CPU read on a GPU
    # too. Before, each counted as a wait: 4 a step here, 28 in a live Trainer job ("34 waits per step").
    summary = cpu_case("ddp_find_unused")
    assert [r.sync_ops for r in summary.ranks] == [[], []]
    assert "host_sync" not in codes(summary)


def test_a_keras_fit_waiting_for_its_loader_is_told_keras_own_workers_by_the_agents_word() -> None:
    # Keras 3's fit() on a DataLoader(num_workers=0) decoding each sample (0.5 ms); Keras steps no torch optimizer, so
    # the step is the agent's backward count, and the agent's word names the loop (no with_stack).
    summary = cpu_case("keras_loader")
    assert summary.loop is Loop.KERAS
    [found] = summary.findings
    assert found.code == "dataloader_bound" and "(num_workers=0)" in found.evidence
    assert found.fix.endswith(
        "In Keras's fit(): fit() on a keras.utils.PyDataset(workers=N, use_multiprocessing=True), or on a torch "
        "DataLoader(num_workers=N, persistent_workers=True)."
    )


def test_a_datasets_reads_of_the_cpu_tensors_it_builds_are_no_wait_for_a_device() -> None:
    # Its __getitem__ reads each label with .item(): 32 reads a step of CPU tensors the batch is built from. Before:
    # "32 waits per step on rank 0 (aten::item)", told to keep loss.item() off the step.
    rank = only_rank(cpu_case("keras_loader"))
    assert rank.sync_ops == [] and all(s.sync_calls == 0 for s in rank.steps)
