"""The job's own collectives weighed as any named cause. A Lightning job that logs four values a step with
``self.log(..., sync_dist=True)`` (recorded: ``tests/data/record_cpu_loops.py``, lightning_sync_dist, two gloo ranks)
runs a barrier and an all-reduce for each inside training_step, which DDP's forward holds: before, they read as the
model's forward time. Lightning 2.6 also broadcasts a SIGTERM flag from rank 0 at every step's start: Lightning's
collective, not the job's."""

from __future__ import annotations

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.comm_fix import own_fix
from orchestrator.analysis.finding_base import share
from orchestrator.analysis.own_collectives import own_collectives
from orchestrator.models.analysis import RankSummary
from tests.support.tracefiles import case

SYNC_DIST = "cpu_lightning_sync_dist"


def _costing(ranks: list[RankSummary], fraction: float) -> list[RankSummary]:
    """``ranks`` whose own collectives take ``fraction`` of the step (as a GPU's barriers would: each a device sync)."""
    return [
        r.model_copy(update={"own_comm": r.own_comm.model_copy(update={"total_ms": fraction * (r.mean_step_ms or 0)})})
        for r in ranks if r.own_comm is not None
    ]


def test_a_logged_values_barrier_and_all_reduce_inside_forward_are_the_jobs_own() -> None:
    for r in analyze_folder(case(SYNC_DIST)).ranks:
        assert r.own_comm is not None and r.own_comm.name == "c10d::barrier + c10d::allreduce_"
        assert r.own_comm.calls == 8 * len(r.steps)  # four values: a barrier and an all-reduce each


def test_the_waits_lightnings_own_broadcast_begins_are_not_the_jobs() -> None:
    # Counted before as the job's (every wait outside forward and backward): 2.2-2.4 ms a step, a warning at 9%.
    ranks = analyze_folder(case(SYNC_DIST)).ranks
    for r in ranks:
        assert not any("_broadcast_sigterm_tensor" in c.name for c in r.own_comm_callers), r.own_comm_callers
    assert ranks[0].own_comm_callers[0].name == "lightning/fabric/utilities/distributed.py(214): _sync_ddp"


def test_the_waits_inside_ddps_forward_are_the_logged_syncs_cost() -> None:
    # Two gloo ranks on one host, both in each call's gloo record while the main thread runs no op: 5.3-5.5 ms a step
    # (22%). DDP's forward annotation around them hid those waits before: 0.4 ms on one rank, nothing told.
    summary = analyze_folder(case(SYNC_DIST))
    assert min(share(r, r.own_comm.total_ms) for r in summary.ranks if r.own_comm) > 0.15
    found = own_collectives(summary.ranks)
    assert found is not None and found.severity == "warning" and found.ranks == [0, 1]
    assert [f.code for f in summary.findings] == ["comm_exposed", "host_sync"]


def test_lightnings_sync_dist_is_told_to_log_without_it_or_per_epoch_where_it_costs() -> None:
    found = own_collectives(_costing(analyze_folder(case(SYNC_DIST)).ranks, 0.10))
    assert found is not None and found.code == "comm_exposed" and found.severity == "warning"
    assert found.title == "The job's own collectives take 10% of the step" and found.ranks == [0, 1]
    assert "4 barriers a step, each followed by an all-reduce (c10d::barrier + c10d::allreduce_" in found.fix
    assert "Lightning's self.log(..., sync_dist=True) runs both for each value it logs on the step" in found.fix
    assert "on_step=False, on_epoch=True, reduced once at the epoch's end" in found.fix
    assert "bucket" not in found.fix  # not DDP's gradients


def test_the_fix_names_where_the_syncs_are_made() -> None:
    rank = analyze_folder(case(SYNC_DIST)).ranks[0]  # its stack samples, no with_stack
    assert "(c10d::barrier + c10d::allreduce_, made in _sync_ddp (lightning/fabric/utilities/distributed.py:214))" in (
        own_fix(rank) or ""
    )


def test_the_same_syncs_in_a_loop_of_its_own_are_told_to_reduce_together() -> None:
    rank = analyze_folder(case(SYNC_DIST)).ranks[0].model_copy(update={"loop": None})
    fix = own_fix(rank) or ""
    assert fix.endswith("Reduce the values together (torch.stack them, one all_reduce, no barrier), every N steps rather than every step.")
    assert "Lightning" not in fix


def test_an_all_reduce_after_backward_without_ddp_may_be_the_gradients_and_is_left_to_the_communication_bar() -> None:
    # DeepSpeed at ZeRO stage 0 (recorded) reduces the gradients after backward: 18% of the step, no own finding.
    summary = analyze_folder(case("cpu_deepspeed"))
    assert all(r.own_comm is not None for r in summary.ranks)
    assert own_collectives(_costing(summary.ranks, 0.10)) is None
    assert summary.findings == []


def test_own_collectives_under_a_twentieth_of_the_step_are_not_told() -> None:
    ranks = analyze_folder(case(SYNC_DIST)).ranks
    assert own_collectives(_costing(ranks, 0.04)) is None and own_collectives(_costing(ranks, 0.06)) is not None


def test_ddps_wait_for_its_last_buckets_at_backwards_end_is_not_the_jobs_own() -> None:
    # tests/data/traces/cpu_ddp_metrics (recorded): DDP's bucket all-reduce starts in backward's last AccumulateGrad
    # node and the main thread waits for it after that node ends (12.5 ms in step 3 on rank 1), outside any node of
    # backward; the 21 metric all-reduces after the optimizer step are the job's. Counted as every wait outside
    # forward and backward, the job's own read 30.0 of rank 1's 30.2 ms a step.
    rank = analyze_folder(case("cpu_ddp_metrics")).ranks[1]
    assert rank.own_comm is not None and rank.own_comm.calls == 21 * len(rank.steps)
    assert 15.0 < rank.own_comm.total_ms < 16.6 and rank.comm_wait_ms > 30.0


def test_an_ignite_metrics_all_reduce_is_its_own_and_ddps_wait_leads_the_fix() -> None:
    # tests/data/traces/cpu_ignite (recorded): Ignite's RunningAverage all-reduces the loss once an iteration, after
    # the optimizer step; DDP's bucket all-reduce and its wait at backward's end hold the rest. Before, that wait was
    # the metric's: "1 collective call a step (c10d::allreduce_) ... holds 3.2 ms of the 3.3 ms ... the job's own values".
    summary = analyze_folder(case("cpu_ignite"))
    for r in summary.ranks:
        assert r.own_comm is not None and r.own_comm.name == "c10d::allreduce_" and r.own_comm.calls == len(r.steps)
        assert 2 * r.own_comm.total_ms < r.comm_wait_ms
        assert r.own_comm_callers[0].name.endswith("_NativeDistModel._do_all_reduce")  # from the agent's samples
    found = summary.findings[0]
    assert found.code == "comm_exposed" and found.fix.startswith("DDP already all-reduces the gradients in buckets")
    assert summary.step_definition == "1 step = AdamW.step ×1; 1 forward pass (DistributedDataParallel)"


# tests/data/record_cpu_metrics.py: two gloo ranks under DDP updating a MulticlassAccuracy and a MulticlassF1Score
# every step (torchmetrics 1.9.0). Before: "Parameters are gathered and gradients reduce-scattered (FSDP, ZeRO-3):
# prefetch each unit's all-gather...", the all-gathers read as FSDP's; the job runs DDP.
TORCHMETRICS = "cpu_ddp_torchmetrics"


def test_a_metrics_state_gathered_after_a_barrier_is_the_jobs_own() -> None:
    for r in analyze_folder(case(TORCHMETRICS)).ranks:
        assert r.own_comm is not None and r.own_comm.name == "c10d::barrier + c10d::allgather_"
        # Eight states (tp, fp, tn, fn of each metric), each a barrier and two all-gathers (its sizes, then itself).
        assert r.own_comm.calls == 8 * 3 * len(r.steps)


def test_torchmetrics_syncing_on_every_step_is_told_dist_sync_on_step_false() -> None:
    found = analyze_folder(case(TORCHMETRICS)).findings[0]
    assert found.code == "comm_exposed" and found.severity == "warning"
    assert "torchmetrics gathers each metric's state from every rank every step" in found.fix
    assert "Keep dist_sync_on_step=False (the default) and call compute() once per epoch" in found.fix
    assert "FSDP" not in found.fix


def test_metrics_that_sync_at_compute_make_no_collective_of_the_jobs() -> None:
    summary = analyze_folder(case("cpu_ddp_torchmetrics_default"))
    assert all(r.own_comm is None for r in summary.ranks)
    assert not any("torchmetrics" in f.fix for f in summary.findings)


def test_an_engines_all_gather_after_the_step_is_not_a_metrics() -> None:
    # DeepSpeed ZeRO-1 all-gathers the updated parameters once the step is done, with no barrier before it.
    for r in analyze_folder(case("cpu_deepspeed_zero1")).ranks:
        assert r.own_comm is not None and "allgather" not in r.own_comm.name
