"""A busy device is told the fix for the kind of kernel that takes its time (matrix math in fp32 or not, memory-bound
kernels, attention, embeddings, compiled kernels), read from the kernel names of real traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.kernel_kinds import KindTime, kernel_kind, short_name
from orchestrator.models.analysis import OpStat
from tests.support.realtraces import external, finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

# Kernel names as real traces carry them (HTA's V100 and A100 traces, TraceLens' H100 / MI300 recordings, the
# H100 recordings in ../shared/gpu-traces).
REAL_NAMES = {
    "volta_sgemm_64x64_tn": "matmul",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "matmul",
    "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1": "matmul",
    "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*)": "matmul",
    "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32": "matmul",
    "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int)": "matmul",
    "cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1": "matmul",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int)": "memory",
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float)": "memory",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*)": "memory",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16>(x)": "memory",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int)": "memory",
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>": "attention",
    "attn_fwd": "attention",
    "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<float, float, float, 5ul>(x)": "embedding",
    "triton_poi_fused__unsafe_view_mul_silu_2": "compiled",
    "_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu": "matmul",
    "batched_transpose_16x32_half": "memory",
    "SubTensorOpWithCastTensor1d": "memory",
    "void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>(__nv_bfloat16 const*)": "memory",
    "void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2>>>(Params)": "attention",
    "merge": "other",
}


@pytest.mark.parametrize(("name", "kind"), REAL_NAMES.items())
def test_real_kernel_names_are_placed_by_what_they_compute(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_a_short_name_drops_return_type_templates_and_parameters() -> None:
    assert short_name("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int>(float*)") == "at::native::CatArrayBatchedCopy"


@given(st.text(max_size=300))
def test_any_kernel_name_gets_a_kind_and_a_short_name_of_at_most_60_characters(name: str) -> None:
    assert kernel_kind(name) in {"attention", "embedding", "compiled", "matmul", "memory", "other"}
    assert len(short_name(name)) <= 60


# ---- the real traces --------------------------------------------------------------


def test_a_busy_v100_in_fp32_is_told_autocast_first() -> None:
    # HTA's V100 ResNet trace (busy 97%): cuDNN's float engines, volta_sgemm and volta_scudnn take 20.4 ms of the
    # 78.8 ms step, BatchNorm and elementwise kernels 15.9 ms. Before: one fixed list (autocast, compile, fused
    # optimizers, FlashAttention) whatever the kernels.
    fix = finding(external("hta_ns_resolution_v100_1rank"), "gpu_bound").fix
    assert fix.startswith("Matrix multiplies and convolutions take 20.4 ms a step (26% of it;")
    assert "in fp32 by their names" in fix and "torch.autocast" in fix
    assert "Memory-bound kernels (elementwise, reductions, normalization, copies) take 15.9 ms" in fix
    assert "FlashAttention" not in fix and "fused optimizer" not in fix


def test_a_busy_recommender_is_told_its_embedding_tables_first() -> None:
    # HTA's trace_diff test V100 trace: FBGEMM's embedding forward and fused backward 18.1 ms a step lead the
    # fp32 GEMMs (11.9 ms); the all-to-all and all-reduce kernels are the communication findings'.
    fix = finding(external("hta_trace_diff_test_v100_r1of2"), "gpu_bound").fix
    assert fix.startswith("Embedding lookups and their backward take 18.1 ms a step")
    assert "Matrix multiplies take 11.9 ms a step" in fix and "nccl" not in fix


# ---- planted traces ---------------------------------------------------------------


def _busy(tmp_path: Path, kernels: list[tuple[str, float]]) -> str:
    """The gpu_bound fix for a 1 ms step whose device runs ``kernels`` back to back."""
    events: list[dict[str, Any]] = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    ts = 0.0
    for i, (name, dur) in enumerate(kernels):
        events += [launch(ts, i + 1, dur=2), kernel(ts + 3, dur, i + 1, name=name)]
        ts += dur
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "gpu_bound").fix


def test_bf16_gemms_that_lead_are_told_fp8_not_autocast(tmp_path: Path) -> None:
    fix = _busy(tmp_path, [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 700), ("attn_fwd", 280)])
    assert fix.startswith("Matrix multiplies take 0.7 ms a step (70% of it;") and "not fp32 by their names" in fix
    assert "fp8" in fix and "torch.autocast" not in fix
    assert "Attention kernels take 0.3 ms a step" in fix


def test_gemms_in_fp8_or_fp4_already_are_not_told_to_try_fp8(tmp_path: Path) -> None:
    # TraceLens' vLLM MI300 recording (a mixture-of-experts model): Triton's bf16 x mxfp4 GEMMs take 78% of the step.
    # Before: "not fp32 by their names: ... fp8 where the device has it" to a job already past fp8.
    fix = _busy(tmp_path, [("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", 600), ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", 300)])
    assert fix.startswith("Matrix multiplies take 0.9 ms a step (90% of it;")
    assert "in 8-bit or narrower precision by their names already" in fix and "max-autotune" in fix
    assert "fp8 where the device has it" not in fix and "torch.autocast" not in fix


def test_fp8_grouped_gemms_of_a_library_of_the_jobs_own_are_not_sent_to_torch_compile(tmp_path: Path) -> None:
    # DeepSeek's DualPipe training trace (H800): its fp8 grouped GEMMs are dpsk::grouped_gemm's, under CUTLASS's
    # launch wrapper. Before: "torch.compile(mode='max-autotune') to pick the GEMM kernels" (it picks none of a
    # library's own) and "pad the vocabulary" for a mixture of experts' per-expert GEMMs.
    fix = _busy(tmp_path, [
        ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(dpsk::grouped_gemm::Params)", 600),
        ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel>(dpsk::grouped_gemm::Params)", 300),
    ])
    assert "in dpsk's own kernels, which torch.compile does not choose" in fix
    assert "each expert's token count in the grouped GEMMs" in fix
    assert "max-autotune" not in fix and "vocabulary" not in fix


@pytest.mark.parametrize(("name", "library"), [
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(dpsk::grouped_gemm::Params)", "dpsk"),
    ("void transformer_engine::fp8_gemm_kernel<128>(x)", "transformer_engine"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", None),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>(Params)", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)", None),
])
def test_a_kernels_library_is_its_namespace_unless_torch_or_a_vendor_library_ships_it(name: str, library: str | None) -> None:
    assert KindTime("matmul", 1.0, (OpStat(name=name, calls=1, total_ms=1.0),)).library == library


def test_kernels_on_streams_that_overlap_say_their_shares_overlap(tmp_path: Path) -> None:
    # HTA's MTIA inference trace: kernels on several queues add up to 25.3 ms of a 25.1 ms iteration, and the shares
    # read "other 25.3 ms (101%)" with nothing to say why.
    events: list[dict[str, Any]] = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    for i, stream in enumerate((7, 8)):
        events += [launch(i, i + 1, dur=1), {**kernel(5, 950, i + 1, name="merge"), "tid": stream, "args": {"correlation": i + 1, "stream": stream, "device": 0}}]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    evidence = finding(analyze_folder(tmp_path), "gpu_bound").evidence
    assert "other 1.9 ms (190%)" in evidence
    assert "Kernels on several streams run at the same time: their times add up to 1.9 ms per 1.0 ms step" in evidence


def test_kernels_on_one_stream_add_no_overlap_note(tmp_path: Path) -> None:
    _busy(tmp_path, [("merge", 600), ("remote", 350)])
    assert "several streams" not in finding(analyze_folder(tmp_path), "gpu_bound").evidence


def test_fused_attention_that_leads_is_told_what_its_cost_grows_with(tmp_path: Path) -> None:
    fix = _busy(tmp_path, [("attn_fwd", 900), ("volta_sgemm_64x64_tn", 30)])
    assert fix.startswith("Attention kernels take 0.9 ms a step") and "sequence length" in fix
    assert "Matrix multiplies" not in fix  # 3% of the step: under the runner-up's share


def test_kernels_the_names_do_not_place_get_the_general_advice_naming_them(tmp_path: Path) -> None:
    fix = _busy(tmp_path, [("merge", 600), ("remote", 350)])
    assert fix.startswith("The kernels that lead (merge, remote) do not say by their names what they compute")


def test_a_runner_up_the_names_do_not_place_adds_no_advice(tmp_path: Path) -> None:
    fix = _busy(tmp_path, [("void at::native::vectorized_elementwise_kernel<4>", 600), ("merge", 350)])
    assert fix.startswith("Memory-bound kernels") and "merge" not in fix


_SOFTMAX = "void at::native::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, at::native::SoftMaxForwardEpilogue>(x)"


def test_a_softmax_that_leads_without_fused_attention_is_told_sdpa(tmp_path: Path) -> None:
    # The pattern of TraceLens' H100 TimeSformer recording (its top kernel is cunn_SoftMaxForward, 68.7 ms, beside bf16
    # GEMMs; that device idles 59% of the step, so it gets no GPU-bound finding), planted on a busy device.
    fix = _busy(tmp_path, [(_SOFTMAX, 600), ("cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn", 350)])
    assert fix.startswith("Memory-bound kernels") and "scaled_dot_product_attention" in fix


def test_a_log_softmax_is_the_loss_and_gets_no_attention_advice(tmp_path: Path) -> None:
    fix = _busy(tmp_path, [(_SOFTMAX.replace("SoftMaxForwardEpilogue", "LogSoftMaxForwardEpilogue"), 600), ("volta_sgemm_64x64_tn", 350)])
    assert fix.startswith("Memory-bound kernels") and "scaled_dot_product_attention" not in fix


@pytest.mark.parametrize(
    ("name", "fp32"),
    [
        ("volta_sgemm_128x64_nn", True),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int)", True),
        ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8", True),
        ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_1LDSB0_APM1", True),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", False),
        ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc", False),
        ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64", False),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64", False),
    ],
)
def test_fp32_is_read_from_the_names_that_say_it(name: str, fp32: bool) -> None:
    assert KindTime("matmul", 1.0, (OpStat(name=name, calls=1, total_ms=1.0),)).fp32 is fp32


@pytest.mark.parametrize(
    ("name", "low"),
    [
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", True),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", True),
        ("Cijk_Alik_Bljk_F8BS_BH_Bias_HA_S_SAB_SAV_UserArgs_MT256x256x128", True),
        ("Custom_Cijk_Alik_Bljk_F8B8BS_BH_UserArgs_MT256x256x128", True),
        ("cutlass_80_tensorop_s8_i16832gemm_s8_256x128_128x3_tn_align16", True),
        ("void fbgemm_gpu::f8f8bf16_rowwise_kernel<128>(x)", True),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", False),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64", False),
        ("volta_sgemm_128x64_nn", False),
    ],
)
def test_8_bit_or_narrower_precision_is_read_from_the_names_that_say_it(name: str, low: bool) -> None:
    assert KindTime("matmul", 1.0, (OpStat(name=name, calls=1, total_ms=1.0),)).low_precision is low
