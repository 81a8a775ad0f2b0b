"""The analysis' semantics, each on the real traces that showed it wrong (issue 11).

Traces are read by path from ``../shared`` (see tests/support/realtraces.py); the
numbers asserted are what those traces hold, checked by hand in the trace.
"""

from __future__ import annotations

import pytest

from orchestrator.analysis.report import render_report
from orchestrator.models.analysis import PHASES
from tests.support.realtraces import EXTERNAL_CASES, codes, external, finding, h100, only_rank

# ---- every trace ------------------------------------------------------------


@pytest.mark.parametrize("case", EXTERNAL_CASES)
def test_every_finding_states_its_bound_and_findings_rank_by_it(case: str) -> None:
    summary = external(case)
    savings = [f.max_saving_ms for f in summary.findings]
    assert savings == sorted(savings, reverse=True)
    one_off = {r.rank for r in summary.ranks if r.window == "device_span"}
    for f in summary.findings:
        if set(f.ranks) & one_off:  # no iterations: nothing is claimed per step
            assert f.max_saving_ms == 0 and f.severity == "info" and "No saving is claimed" in f.evidence
        elif f.code not in ("memory_peak", "activation_recompute"):  # a risk, not step time; a trade for memory
            assert f.max_saving_ms > 0 and "saves at most" in f.evidence
            assert 0 < f.max_saving_fraction <= 1


@pytest.mark.parametrize("case", EXTERNAL_CASES)
def test_phases_add_up_to_the_step_on_every_real_trace(case: str) -> None:
    for rank in external(case).ranks:
        for step in rank.steps:
            assert sum(step.phases.get(p) for p in PHASES) == pytest.approx(step.duration_ms, abs=1e-3)


# ---- copies: direction and host memory, each with its own fix -----------------


def test_device_to_device_copies_on_a_busy_gpu_get_no_copy_warning() -> None:
    # HTA's ns_resolution trace: 288 DtoD copies per step on a GPU busy 97% of the step.
    summary = external("hta_ns_resolution_v100_1rank")
    rank = only_rank(summary)
    (dtod,) = rank.copies
    assert (dtod.direction, dtod.host_memory, round(dtod.calls_per_step)) == ("DtoD", None, 288)
    assert rank.mean_phases.memcpy == 0
    assert "htod_copy" not in codes(summary)


def test_a_blocking_download_is_a_wait_not_told_to_pin_memory() -> None:
    # HTA's negative_queue trace: 6 pageable DtoH copies per step hold the host ~152 ms of a 215 ms step.
    summary = external("hta_negative_queue_a100_r0of16")
    rank = only_rank(summary)
    kinds = {(c.direction, c.host_memory): c for c in rank.copies}
    assert set(kinds) == {("DtoD", None), ("DtoH", "pageable"), ("HtoD", "pageable"), ("HtoD", "pinned")}
    assert kinds[("DtoH", "pageable")].host_blocked_ms_per_step == pytest.approx(151.7, abs=0.1)
    assert rank.mean_phases.sync == pytest.approx(152.2, abs=0.1) and rank.mean_phases.memcpy < 1
    assert "host_sync" in codes(summary) and "htod_copy" not in codes(summary)
    sync = finding(summary, "host_sync")
    assert "pin_memory=True" not in sync.fix and "Pinning memory does not help" in sync.fix
    # The bound is the device's idle time during the waits, not the host's wait (tests/unit/test_analysis_idle.py).
    assert sync.max_saving_ms < rank.gpu.idle_ms_per_step < rank.mean_phases.sync


def test_pageable_uploads_are_told_to_pin_memory() -> None:
    # TensorBoard's ResNet50 num_workers=4 sample (PyTorch 1.8): 2 pageable HtoD copies block 14 ms a step.
    summary = external("tbplugin_resnet50_nw4_b")
    (upload,) = only_rank(summary).copies
    assert (upload.direction, upload.host_memory) == ("HtoD", "pageable")
    copy = finding(summary, "htod_copy")
    assert "2 pageable HtoD" in copy.evidence
    assert "pin_memory=True" in copy.fix and "non_blocking=True" in copy.fix


def test_pinned_uploads_are_not_a_finding() -> None:
    # The H100 recording after its fix copies from pinned memory with non_blocking=True.
    summary = h100("seed003_after")
    (upload,) = only_rank(summary).copies
    assert (upload.direction, upload.host_memory) == ("HtoD", "pinned")
    assert "htod_copy" not in codes(summary)


def test_a_wait_inside_an_upload_for_earlier_work_is_a_sync_not_a_copy() -> None:
    # PARAM's DLRM rank 1: a 1 µs pageable upload whose stream sync waits 6.5 ms for an all-to-all.
    rank = external("param_dlrm_v100_8ranks").ranks[1]
    assert rank.mean_phases.sync == pytest.approx(7.5, abs=0.1)
    assert rank.mean_phases.memcpy < 0.5


def test_cuda_initialisation_in_the_first_to_is_no_copy() -> None:
    # HTA's AlexNet benchmark: its first .to("cuda") spends 29.9 s creating the CUDA context.
    summary = external("hta_alexnet_no_profilerstep")
    rank = only_rank(summary)
    assert rank.mean_phases.memcpy == pytest.approx(57.7, abs=0.5)  # the 16 real copies
    assert "htod_copy" not in codes(summary)


# ---- backward on the autograd thread ----------------------------------------


def test_backward_inside_record_function_counts_as_backward() -> None:
    # HTA's traces wrap loss.backward() in record_function("## backward ##") on the main thread.
    rank = only_rank(external("hta_trace_diff_test_v100_r1of2"))
    assert rank.mean_phases.backward == pytest.approx(36.0, abs=0.1)
    assert rank.mean_phases.other < 3


def test_backward_run_by_the_autograd_thread_counts_as_backward() -> None:
    # HTA's df_index_resolver: the main thread records nothing while the autograd thread runs backward.
    rank = only_rank(external("hta_df_index_resolver_v100_r1of2"))
    assert rank.mean_phases.backward == pytest.approx(247.1, abs=0.1)
    assert rank.mean_phases.backward > 0.7 * rank.mean_step_ms
    assert rank.mean_phases.other < 10


# ---- stragglers: late arrivers and waiters ------------------------------------


def test_late_arrivers_are_told_apart_from_waiters() -> None:
    # PARAM's 8-rank DLRM: ranks 2, 6 and 7 start the step up to 7.5 ms late; the others wait for them.
    summary = external("param_dlrm_v100_8ranks")
    spread = summary.step_spread
    assert spread.late_ranks == [2, 6, 7]
    assert {1, 3, 4, 5} <= set(spread.waiting_ranks) and not set(spread.late_ranks) & set(spread.waiting_ranks)
    assert spread.arrival_spread_ms == pytest.approx(7.5, abs=0.1)
    # The waiters' steps are the longest; the slowest rank is the one whose work ends last.
    assert max(summary.ranks, key=lambda r: r.median_step_ms).rank == 1
    assert spread.slowest_rank == 7 and spread.slowest_rank not in spread.waiting_ranks


def test_the_straggler_finding_names_the_late_ranks_and_blames_no_waiter() -> None:
    summary = external("param_dlrm_v100_8ranks")
    assert [(s.rank, s.cause) for s in summary.stragglers] == [(2, "late_arrival"), (6, "late_arrival"), (7, "late_arrival")]
    straggler = finding(summary, "straggler")
    assert straggler.title == "Rank 7 starts its steps late; the others wait for it"
    assert straggler.ranks == [2, 6, 7] and straggler.severity == "warning"
    assert straggler.max_saving_ms == pytest.approx(7.5, abs=0.1)


def test_a_waiters_sync_is_not_blamed_for_its_wait_on_late_ranks() -> None:
    # Ranks 1, 3, 4, 5 wait 5-9.5 ms a step in cudaStreamSynchronize, for ranks 2, 6 and 7; the device idles
    # under 0.5 ms of it, and that is the late ranks' (idle cause late_rank), not a sync to remove.
    summary = external("param_dlrm_v100_8ranks")
    waiter = summary.ranks[1]
    assert waiter.waits_for_others_ms == pytest.approx(9.5, abs=0.1)
    assert waiter.idle.ms("late_rank") > 0 and waiter.idle.ms("sync") == 0
    assert "host_sync" not in codes(summary)


# ---- what matters most: bounds, GPU-bound jobs --------------------------------


def test_a_gpu_bound_job_gets_its_kernels_and_no_sync_or_copy_warning() -> None:
    # HTA's trace_diff test trace: the V100 is busy 96% of the step.
    summary = external("hta_trace_diff_test_v100_r1of2")
    rank = only_rank(summary)
    assert rank.gpu.utilization == pytest.approx(0.963, abs=0.001)
    top = summary.findings[0]
    assert top.code == "gpu_bound" and top.title == "GPU-bound: the device is busy 96% of the step"
    assert "split_embedding_backward_codegen_rowwise_adagrad" in top.evidence
    # Its syncs leave the device idle 0.04 ms a step: no sync or copy finding at all.
    assert not {"host_sync", "htod_copy"} & set(codes(summary))


def test_an_almost_fully_busy_gpu_leads_with_gpu_bound() -> None:
    summary = external("hta_ns_resolution_v100_1rank")
    assert codes(summary) == ["gpu_bound"]
    assert "cudnn::bn_bw" in summary.findings[0].evidence


# ---- devices and windows -------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "device"),
    [
        ("hta_mtia_single_rank", "mtia"),
        ("hta_amd_mi250_minitoy", "rocm"),
        ("tracelens_mi300_resnet_ckpt_r0of8", "rocm"),
        ("tbplugin_resnet50_nw0_a", "cuda"),
        ("hta_cpu_only_r34of300", "cpu"),
    ],
)
def test_the_device_kind_is_named(case: str, device: str) -> None:
    summary = external(case)
    assert {r.device for r in summary.ranks} == {device}
    if device != "cpu":
        assert not any("CPU-only" in f.evidence for f in summary.findings)


def test_an_mtia_trace_has_device_statistics() -> None:
    rank = only_rank(external("hta_mtia_single_rank"))
    assert rank.gpu is not None and rank.gpu.utilization == pytest.approx(0.578, abs=0.001)
    assert rank.top_kernels


def test_an_mtia_traces_runtime_calls_are_not_called_cuda_or_hip() -> None:
    # MTIA's runtime (runFunction - job_prep_and_submit_for_execution, 943.6 ms a step) leaves its device idle. Before:
    # "the host is in CUDA/HIP runtime calls" on a device that has neither.
    (finding,) = external("hta_mtia_single_rank").findings
    assert "943.6 ms the host is in the device runtime's calls (allocator, slow launches, events, streams)" in finding.evidence
    assert "CUDA" not in finding.evidence and "HIP" not in finding.evidence


@pytest.mark.parametrize(
    ("case", "window", "issue"),
    [
        ("hta_alexnet_no_profilerstep", "device_span", "analysed as one window"),
        ("param_resnet_no_profilerstep", "iterations", "iterations, each starting at"),
    ],
)
def test_a_gpu_trace_without_profiler_steps_says_which_window_it_used(case: str, window: str, issue: str) -> None:
    summary = external(case)
    rank = only_rank(summary)
    assert rank.window == window and [s.step for s in rank.steps] == list(range(len(rank.steps)))
    assert any(issue in i for i in summary.issues)
    assert rank.gpu is not None and rank.gpu.utilization > 0
    assert summary.findings and all("(no ProfilerStep)" in f.evidence for f in summary.findings if f.code != "memory_peak")


# ---- the DataLoader-bound step, before and after its fix -------------------------


def test_the_pytorch_1_8_num_workers_0_sample_is_dataloader_bound() -> None:
    summary = external("tbplugin_resnet50_nw0_a")
    top = summary.findings[0]
    assert top.code == "dataloader_bound" and top.title == "Data loading takes 40% of the step"
    assert "num_workers=0" in top.evidence


def test_the_num_workers_4_samples_are_not_dataloader_bound() -> None:
    for case in ("tbplugin_resnet50_nw4_a", "tbplugin_resnet50_nw4_b"):
        assert "dataloader_bound" not in codes(external(case))


def test_the_h100_recording_is_dataloader_bound_before_its_fix_and_not_after() -> None:
    before, after = h100("seed003_before"), h100("seed003_after")
    assert before.findings[0].code == "dataloader_bound"
    assert before.findings[0].max_saving_fraction == pytest.approx(0.84, abs=0.01)
    assert "dataloader_bound" not in codes(after)
    assert only_rank(after).gpu.kernel_ms_per_step == pytest.approx(1.4, abs=0.05)


def test_the_report_says_who_arrives_late_and_who_waits() -> None:
    html = render_report(external("param_dlrm_v100_8ranks"))
    assert "ranks 2, 6, 7 start their steps up to 7.5 ms late and ranks 0, 1, 3, 4, 5 wait for them" in html


def test_an_idle_rocm_gpu_is_named_as_such() -> None:
    # HTA's MI250 mini toy: 0.1 ms of kernels in a 4.7 ms step.
    top = external("hta_amd_mi250_minitoy").findings[0]
    assert (top.code, top.title) == ("low_gpu_utilization", "The ROCm device is busy 2% of the step")


def test_exposed_communication_on_a_lone_rank_of_a_larger_job_says_it_may_be_waiting() -> None:
    # HTA's CPU-only trace: rank 34 of 300 spends 179 ms of a 210 ms step in collectives.
    summary = external("hta_cpu_only_r34of300")
    comm = finding(summary, "comm_exposed")
    assert comm.ranks == [34] and comm.max_saving_ms == pytest.approx(178.8, abs=0.1)
    assert "part of the wait may be for slower ranks" in comm.evidence
