"""Collectives are told apart by what they run: kernels of communication libraries other than NCCL are collectives
(not compute to tune), and exposed communication gets the fix of the collective that leads it (an all-to-all is not
told DDP's gradient buckets, a pipeline's sends not FSDP's prefetching)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.kernel_kinds import short_name
from orchestrator.analysis.spans import collective_kind, is_comm_kernel_name, is_compute_kernel
from orchestrator.models.analysis import COLLECTIVE_LABELS, Finding, Summary
from orchestrator.traces.loader import Span
from tests.support.realtraces import external, finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

# Kernel names as traces carry them: DeepSeek's public DeepEP training step (deepseek-ai/profile-data, H800),
# TraceLens' B200 vLLM trace (torch's symmetric-memory all-reduce), vLLM's custom all-reduce.
COLLECTIVE_KERNELS = [
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*, int4 const*)",
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*, int const*, int*)",
    "void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*, int*, long*, float*, int*)",
    "void deep_ep::internode_ll::combine<false, 7168, 8, 2>(void*, void*, int*, void*)",
    "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, unsigned long)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*)",
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
]
COMPUTE_KERNELS = [
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void cub::DeviceReduceByKeyKernel<cub::DispatchReduceByKey<long*, long*>>(long*)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>(x)",
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(dpsk::grouped_gemm::Params)",
]


def _span(name: str, written: str | None = None) -> Span:
    return Span(0.0, 1.0, name, "kernel", 0, 7, args={"collective": written} if written else None)


@pytest.mark.parametrize("name", COLLECTIVE_KERNELS)
def test_communication_libraries_kernels_are_collectives_not_compute(name: str) -> None:
    assert is_comm_kernel_name(name)
    assert not is_compute_kernel(_span(name))


@pytest.mark.parametrize("name", COMPUTE_KERNELS)
def test_kernels_named_like_a_collective_that_compute_stay_compute(name: str) -> None:
    assert not is_comm_kernel_name(name)
    assert is_compute_kernel(_span(name))


@pytest.mark.parametrize(
    ("name", "written", "kind"),
    [
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "all_to_allv", "all_to_all"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "all_to_all", "all_to_all"),
        # NCCL 2.12-2.18's generic kernel: the name of the send/recv one, run for any collective on SIMPLE.
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", None, "other"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None, "send_recv"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "_allgather_base", "all_gather"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "_reduce_scatter_base", "reduce_scatter"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "allreduce", "all_reduce"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None, "other"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", None, "all_reduce"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "broadcast", "broadcast"),
        (COLLECTIVE_KERNELS[0], None, "all_to_all"),
        (COLLECTIVE_KERNELS[4], None, "all_reduce"),
    ],
)
def test_a_collective_is_named_by_what_pytorch_wrote_on_its_kernel_before_the_kernels_own_name(
    name: str, written: str | None, kind: str
) -> None:
    assert collective_kind(_span(name, written)) == kind


@given(st.text(max_size=200), st.one_of(st.none(), st.text(max_size=50)))
def test_any_kernel_and_written_name_get_a_collective_the_report_can_word(name: str, written: str | None) -> None:
    assert collective_kind(_span(name, written)) in COLLECTIVE_LABELS


def test_a_cutlass_wrapper_is_named_by_the_kernel_it_wraps() -> None:
    # FlashAttention 3's and DeepGEMM's kernels are all cutlass::device_kernel<...>: the wrapper's name says nothing.
    assert short_name("void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2>>>(Params)") == "flash::FlashAttnBwd"
    assert short_name(COMPUTE_KERNELS[3]) == "dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel"


# ---- planted traces: a 1 ms step, compute on stream 7, collectives on stream 8 ------------------------------------


def _collective(ts: float, dur: float, corr: int, name: str, written: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"correlation": corr, "stream": 8, "device": 0}
    if written:
        args["Collective name"] = written
    return x_event(name, ts, dur, cat="kernel", pid=0, tid=8, **args)


def _analyse(tmp_path: Path, compute: tuple[float, float], comm: tuple[float, float], name: str, written: str | None) -> Summary:
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1, dur=2),
        kernel(compute[0], compute[1] - compute[0], 1),
        launch(3, 2, dur=2),
        _collective(comm[0], comm[1] - comm[0], 2, name, written),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def _exposed(tmp_path: Path, name: str, written: str | None = None) -> Finding:
    """The comm finding when the collective runs alone for half the step, after 0.3 ms of compute."""
    return finding(_analyse(tmp_path, (5, 300), (300, 800), name, written), "comm_exposed")


@pytest.mark.parametrize(
    ("name", "written", "nccl_note"),
    [
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "all_to_allv", True),
        ("void deep_ep::internode::dispatch<false, 8, false, 8>(int4*, float*)", None, False),
    ],
)
def test_an_exposed_all_to_all_is_told_to_overlap_it_with_another_micro_batch_not_to_bucket_gradients(
    tmp_path: Path, name: str, written: str | None, nccl_note: bool
) -> None:
    # Before: every exposed collective was told DDP's bucket_cap_mb and no_sync(), which do not move an all-to-all.
    found = _exposed(tmp_path, name, written)
    assert "Collective kernel time per step by collective: all-to-all 0.5 ms (0.5 exposed)." in found.evidence
    assert found.fix.startswith("The all-to-all moves tokens to their experts and back")
    assert "two micro-batches" in found.fix and "bucket_cap_mb" not in found.fix
    assert ("DeepEP's dispatch and combine kernels are built for this exchange" in found.fix) is nccl_note


def _sends_under(tmp_path: Path, host_op: str, compute: str = "volta_sgemm_128x64_nn") -> Finding:
    """The comm finding for NCCL's send/recv kernel with no collective name written on it, launched inside
    ``host_op`` on the main thread, after 0.3 ms of ``compute``."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1, dur=2),
        kernel(5, 295, 1, name=compute),
        x_event(host_op, 2, 10),
        launch(3, 2, dur=2),
        _collective(300, 500, 2, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", None),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "comm_exposed")


def test_send_recv_kernels_an_all_to_all_launched_are_told_as_the_all_to_all_of_sharded_embeddings(tmp_path: Path) -> None:
    # HTA's 128-rank TorchRec trace (not shared): 198 ms of ncclKernel_SendRecv a step under c10d::alltoall_base_,
    # no collective name on the kernels (PyTorch before 2.2). Before: told a pipeline's schedule.
    found = _sends_under(tmp_path, "c10d::alltoall_base_", compute="void split_embedding_codegen_forward_unweighted_kernel<float>(x)")
    assert "by collective: all-to-all 0.5 ms (0.5 exposed)." in found.evidence
    assert found.fix.startswith("The all-to-all exchanges sharded embeddings") and "TrainPipelineSparseDist" in found.fix
    assert "pipeline's bubble" not in found.fix
    assert found.title == "Communication does not overlap computation"


def test_exposed_sends_and_receives_are_told_the_pipelines_schedule(tmp_path: Path) -> None:
    found = _exposed(tmp_path, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert found.title == "Sends and receives do not overlap computation: pipeline stages wait for their neighbours"
    assert "send/recv 0.5 ms" in found.evidence
    assert found.fix.startswith("Point-to-point sends and receives are pipeline stages waiting for their neighbours")
    assert "ScheduleInterleaved1F1B" in found.fix and "bucket_cap_mb" not in found.fix


@pytest.mark.parametrize(
    ("host_op", "kind", "fix"),
    [
        ("c10d::send", "send/recv", "Point-to-point sends and receives"),
        # HTA's TorchRec traces (NCCL 2.12-2.18): c10d::allreduce_ and c10d::_allgather_base_ launch the generic
        # ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t too. Before: all of it read as an all-to-all (or as sends).
        ("c10d::allreduce_", "all-reduce", "Let gradient communication run during backward"),
        ("c10d::_allgather_base_", "all-gather", "Parameters are gathered"),
    ],
)
def test_nccls_generic_kernel_named_send_recv_is_the_collective_whose_call_launched_it(
    tmp_path: Path, host_op: str, kind: str, fix: str
) -> None:
    found = _sends_under(tmp_path, host_op)
    assert f"by collective: {kind} 0.5 ms (0.5 exposed)." in found.evidence
    assert found.fix.startswith(fix)


def test_nccls_generic_kernel_that_nothing_names_stays_unnamed(tmp_path: Path) -> None:
    found = _exposed(tmp_path, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)")
    assert "by collective: unnamed 0.5 ms (0.5 exposed)." in found.evidence
    assert "ScheduleInterleaved1F1B" not in found.fix


def test_a_collective_launched_from_the_autograd_thread_is_named_by_that_threads_call(tmp_path: Path) -> None:
    # DDP's all-reduces are launched from the autograd thread, inside c10d::allreduce_ there; the main thread's
    # only collective is a broadcast. Before: the kernel (no collective name written) read "unnamed".
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("c10d::broadcast_", 1, 1),
        launch(0, 1, dur=2),
        kernel(5, 295, 1),
        x_event("c10d::allreduce_", 2, 10, tid=2),
        x_event("record_param_comms", 3, 8, tid=2),
        x_event("cudaLaunchKernel", 4, 2, cat="cuda_runtime", tid=2, correlation=2),
        _collective(300, 500, 2, "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    found = finding(analyze_folder(tmp_path), "comm_exposed")
    assert "by collective: all-reduce 0.5 ms (0.5 exposed)." in found.evidence


def test_exposed_all_gathers_are_told_to_prefetch_them(tmp_path: Path) -> None:
    found = _exposed(tmp_path, "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "_allgather_base")
    assert "all-gather 0.5 ms" in found.evidence
    assert found.fix.startswith("Parameters are gathered and gradients reduce-scattered (FSDP, ZeRO-3)")


def test_an_exposed_all_reduce_keeps_the_gradient_bucket_advice(tmp_path: Path) -> None:
    found = _exposed(tmp_path, "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "allreduce")
    assert "all-reduce 0.5 ms" in found.evidence
    assert found.fix.startswith("Let gradient communication run during backward") and "bucket_cap_mb" in found.fix


def _with_collectives(tmp_path: Path, compute_until: float, *collectives: tuple[float, float, str | None]) -> Summary:
    """The analysis of a 1 ms step with compute from 5 µs to ``compute_until`` and NCCL's generic kernel run for
    each (start, duration, collective name written on it) of ``collectives``."""
    events = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), launch(0, 1, dur=2), kernel(5, compute_until - 5, 1)]
    for corr, (ts, dur, written) in enumerate(collectives, start=2):
        events += [launch(corr, corr, dur=1), _collective(ts, dur, corr, "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", written)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_unnamed_collectives_do_not_choose_the_fix_over_a_named_one(tmp_path: Path) -> None:
    found = finding(_with_collectives(tmp_path, 300, (300, 400, None), (700, 100, "all_to_allv")), "comm_exposed")
    assert "by collective: unnamed 0.4 ms (0.4 exposed), all-to-all 0.1 ms (0.1 exposed)." in found.evidence
    assert found.fix.startswith("The all-to-all moves tokens")


def test_an_exposed_all_gather_of_sharded_embeddings_is_told_torchrecs_pipeline_not_fsdps_prefetch(tmp_path: Path) -> None:
    # TorchRec's row-wise sharding reduce-scatters pooled embeddings forward and all-gathers their gradients backward:
    # no FSDP in the job. Before: told FSDP's prefetching.
    found = _sends_under(tmp_path, "c10d::_allgather_base_", compute="void split_embedding_codegen_forward_unweighted_kernel<float>(x)")
    assert "by collective: all-gather 0.5 ms (0.5 exposed)." in found.evidence
    assert found.fix.startswith("The all-gather exchanges sharded embeddings (FBGEMM's tables, TorchRec; row-wise sharding")
    assert "TrainPipelineSparseDist" in found.fix and "prefetch" not in found.fix


def test_an_exposed_broadcast_is_told_ddps_buffer_broadcast_not_gradient_buckets(tmp_path: Path) -> None:
    # Before: a broadcast that leads was told DDP's bucket_cap_mb, which only moves gradient all-reduces.
    found = _sends_under(tmp_path, "c10d::broadcast_")
    assert "by collective: broadcast 0.5 ms (0.5 exposed)." in found.evidence
    assert found.fix.startswith("The broadcast is most often DDP copying module buffers") and "broadcast_buffers=False" in found.fix
    assert "bucket_cap_mb" not in found.fix


def test_the_fix_is_the_exposed_collectives_not_the_one_compute_hides(tmp_path: Path) -> None:
    # A 0.4 ms all-reduce that compute hides and a 0.3 ms all-gather that nothing overlaps: the all-gather is what
    # costs the step. Before: the larger kernel time chose, and DDP's bucket advice was given.
    found = finding(_with_collectives(tmp_path, 500, (50, 400, "allreduce"), (500, 300, "_allgather_base")), "comm_exposed")
    assert "by collective: all-reduce 0.4 ms (0.0 exposed), all-gather 0.3 ms (0.3 exposed)." in found.evidence
    assert found.fix.startswith("Parameters are gathered and gradients reduce-scattered")


def test_a_busy_device_says_how_much_of_its_collectives_the_compute_hides(tmp_path: Path) -> None:
    # DeepSeek's DeepEP step: dispatch/combine 98 ms of kernel time in a 112 ms step, 96% of it under the GEMMs.
    # Before: the DeepEP kernels led the GPU-bound finding's kernel list and were told "look them up in the trace".
    combine = "void deep_ep::internode::combine<false, 8, __nv_bfloat16>(int4*, float*)"
    found = finding(_analyse(tmp_path, (5, 960), (100, 600), combine, None), "gpu_bound")
    assert (
        "Collective kernels (deep_ep::internode::combine) take 0.5 ms a step beside the compute, "
        "100% of it under compute kernels (0.0 ms exposed)." in found.evidence
    )
    assert "deep_ep" not in found.fix and "look them up" not in found.fix


def test_hta_torchrec_traces_generic_kernels_are_split_by_the_calls_that_launched_them() -> None:
    # Every collective kernel of this trace is NCCL 2.12-2.18's generic "SendRecv" one; its calls are all-to-alls,
    # all-reduces and all-gathers. Before: all of it read as one all-to-all.
    for rank in external("hta_trace_filter_2of128").ranks:
        assert rank.gpu is not None
        assert {"all_to_all", "all_reduce", "all_gather"} <= set(rank.gpu.comm_by_collective)
        assert "send_recv" not in rank.gpu.comm_by_collective


def test_collectives_compute_hides_alike_are_ordered_by_their_kernel_time(tmp_path: Path) -> None:
    # Both under compute (0 exposed): the 0.4 ms all-reduce leads, not the 0.1 ms all-to-all that started first.
    (rank,) = _with_collectives(tmp_path, 990, (10, 100, "all_to_allv"), (200, 400, "allreduce")).ranks
    assert rank.gpu is not None and rank.gpu.comm_exposed_by_collective == {"all_reduce": 0.0, "all_to_all": 0.0}
    assert list(rank.gpu.comm_exposed_by_collective) == ["all_reduce", "all_to_all"]
