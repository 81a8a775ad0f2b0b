"""A fix names only precisions the device computes fast, read from the device model the trace names
(``deviceProperties``): fp16 with a GradScaler on a V100, bf16 or TF32 on an A100, fp8 only on a device with fp8
units; a trace that names no device keeps the general words."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.readers import reading_fix
from orchestrator.models.accelerator import Accelerator
from tests.support.realtraces import external, finding, h100, only_rank
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch
from tests.unit.test_analysis_sync_readers import _rank

V100 = {"name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}
H100 = {"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}
MI250 = {"name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0}
MI300 = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4}
SGEMM = "volta_sgemm_128x64_nn"
BF16_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
FP32_CONV = "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int)"


def _busy_fix(tmp_path: Path, name: str, devices: list[dict[str, Any]], *, hip: bool = False, trains: bool = True) -> str:
    """The gpu_bound fix for a 1 ms step whose device runs ``name`` 950 µs, in a trace naming ``devices``; a training
    step's host runs backward (an autograd node) while it does, an inference step's nothing."""
    events: list[dict[str, Any]] = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    events += [launch(0, 1, dur=2), kernel(3, 950, 1, name=name)]
    if trains:
        events.append(x_event("autograd::engine::evaluate_function: MmBackward0", 400, 500))
    if hip:
        events[1] = {**events[1], "name": "hipLaunchKernel"}
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1, deviceProperties=[{"id": i, **d} for i, d in enumerate(devices)])
    return finding(analyze_folder(tmp_path), "gpu_bound").fix


# ---- the real traces --------------------------------------------------------------


def test_a_v100_in_fp32_is_told_fp16_with_a_grad_scaler_not_bf16() -> None:
    # HTA's V100 ResNet trace (busy 97%): fp32 cuDNN engines and volta_sgemm lead. Before: "run them in bf16 ...
    # (float16 with a torch.amp.GradScaler before Ampere), or at least TF32 on Ampere and later": a V100 has neither.
    fix = finding(external("hta_ns_resolution_v100_1rank"), "gpu_bound").fix
    assert "float16 under torch.autocast(device_type='cuda', dtype=torch.float16) with a torch.amp.GradScaler" in fix
    assert "the Tesla V100-SXM2-32GB (sm_70) has tensor cores for fp16 but none for bf16 or TF32" in fix
    assert "dtype=torch.bfloat16" not in fix and "set_float32_matmul_precision" not in fix
    assert "fp16 instead of fp32 halves the bytes" in fix


def test_the_trace_names_its_device_model_on_every_rank_summary() -> None:
    assert only_rank(external("hta_ns_resolution_v100_1rank")).accelerator == Accelerator(
        name="Tesla V100-SXM2-32GB", runtime="cuda", capability=(7, 0)
    )
    assert only_rank(external("tracelens_mi300_resnet_ckpt_r0of8")).accelerator == Accelerator(
        name="AMD Instinct MI300X", runtime="rocm", capability=(9, 4)
    )
    assert only_rank(h100("seed003_after")).accelerator == Accelerator(name="NVIDIA H100 80GB HBM3", runtime="cuda", capability=(9, 0))


def test_matrix_multiplies_without_convolutions_are_not_told_channels_last() -> None:
    # HTA's trace_diff test V100 trace: its fp32 GEMMs are a recommender's linear layers, no convolution among them.
    fix = finding(external("hta_trace_diff_test_v100_r1of2"), "gpu_bound").fix
    assert "Matrix multiplies take 11.9 ms a step" in fix
    assert "convolutions" not in fix and "channels_last" not in fix


# ---- planted traces ---------------------------------------------------------------


def test_an_a100_in_fp32_is_told_bf16_or_tf32(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, FP32_CONV, [A100] * 8)
    assert "run them in bf16 under torch.autocast(device_type='cuda', dtype=torch.bfloat16), or at least TF32" in fix
    assert "the NVIDIA A100-SXM4-80GB (sm_80) has tensor cores for both" in fix
    assert "GradScaler" not in fix and "before Ampere" not in fix
    assert "channels_last for the convolutions" in fix


def test_an_mi300_in_fp32_is_told_bf16_and_no_tf32(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, "Cijk_Ailk_Bljk_SB_MT64x64x16_SN_1LDSB0_APM1", [MI300], hip=True)
    assert "run them in bf16 under torch.autocast(device_type='cuda', dtype=torch.bfloat16): the AMD Instinct MI300X has matrix cores for it" in fix
    assert "TF32" not in fix


def test_bf16_gemms_on_an_h100_are_told_fp8(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, BF16_GEMM, [H100])
    assert "the math itself is the cost: fp8, which the NVIDIA H100 80GB HBM3 (sm_90) has matrix units for" in fix


@pytest.mark.parametrize("device", [A100, MI250], ids=["a100", "mi250"])
def test_bf16_gemms_on_a_device_without_fp8_units_are_not_told_fp8(tmp_path: Path, device: dict[str, Any]) -> None:
    fix = _busy_fix(tmp_path, BF16_GEMM, [device], hip=device is MI250)
    assert "fp8" not in fix and "the math itself is the cost: dimensions in multiples of 64" in fix


def test_a_trace_naming_no_device_gets_the_general_precision_advice(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, SGEMM, [])
    assert "(float16 with a torch.amp.GradScaler before Ampere), or at least TF32 on Ampere and later" in fix


def test_an_inference_step_is_told_fp8_quantization_not_float8_training(tmp_path: Path) -> None:
    # TraceLens' vLLM decode recordings on an H100 (not shared): before, "torchao's float8 training" to a serving job.
    fix = _busy_fix(tmp_path, BF16_GEMM, [H100], trains=False)
    assert "fp8, which the NVIDIA H100 80GB HBM3 (sm_90) has matrix units for (torchao's float8 weight and activation" in fix
    assert "training" not in fix and "Transformer Engine" not in fix


def test_a_training_step_is_told_float8_training(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, BF16_GEMM, [H100])
    assert "(Transformer Engine, torchao's float8 training)" in fix and "quantization" not in fix


def test_an_inference_step_in_fp32_on_a_v100_is_told_fp16_without_a_grad_scaler(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, SGEMM, [V100], trains=False)
    assert "float16 under torch.autocast(device_type='cuda', dtype=torch.float16): the Tesla V100" in fix
    assert "GradScaler" not in fix


def test_a_trace_naming_two_device_models_gets_the_general_precision_advice(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, SGEMM, [V100, A100])
    assert "(float16 with a torch.amp.GradScaler before Ampere)" in fix and "V100" not in fix


def test_a_grad_scaler_on_a_v100_is_not_told_that_bf16_needs_none() -> None:
    rank = _rank([("aten::item", 1)], [], 1, grad_scaler=True)
    assert "bf16 autocast needs no scaler" in reading_fix(rank)
    v100 = rank.model_copy(update={"accelerator": Accelerator(name="Tesla V100", runtime="cuda", capability=(7, 0))})
    assert "fused=True on AdamW" in reading_fix(v100) and "bf16" not in reading_fix(v100)


_BF16_MUL = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(int)"


def test_memory_bound_kernels_in_bf16_already_are_not_told_bf16(tmp_path: Path) -> None:
    # TraceLens' H100 recording of a bf16 Qwen model (not shared): ATen's BFloat16 elementwise kernels lead its
    # memory-bound time. Before: "bf16 instead of fp32 halves the bytes they move" to a job in bf16.
    fix = _busy_fix(tmp_path, _BF16_MUL, [H100])
    assert fix.startswith("Memory-bound kernels") and "bf16" not in fix and "fp16" not in fix


def test_memory_bound_kernels_in_fp32_on_a_v100_are_told_fp16(tmp_path: Path) -> None:
    fix = _busy_fix(tmp_path, "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int)", [V100])
    assert "fp16 instead of fp32 halves the bytes they move" in fix


# ---- the device model from any deviceProperties ------------------------------------

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=200), st.lists(st.integers(), max_size=2))


@given(
    st.lists(st.dictionaries(st.sampled_from(["name", "computeMajor", "computeMinor", "id"]), _VALUES), max_size=4),
    st.sampled_from(["cuda", "rocm", "mtia", "cpu"]),
)
def test_any_device_properties_give_a_valid_model_or_none(properties: list[dict[str, Any]], runtime: Any) -> None:
    model = Accelerator.of(properties, runtime)
    if model is not None:
        assert runtime in ("cuda", "rocm") and 0 < len(model.name) <= 120
        assert all(0 <= v < 100 for v in model.capability)
        assert model.name in model.label


_FORMATS: tuple[Literal["fp16", "bf16", "tf32", "fp8"], ...] = ("fp16", "bf16", "tf32", "fp8")


@pytest.mark.parametrize(
    ("device", "runtime", "formats"),
    [
        ({"name": "Tesla P100", "computeMajor": 6, "computeMinor": 0}, "cuda", set()),
        (V100, "cuda", {"fp16"}),
        ({"name": "GeForce RTX 2080 Ti", "computeMajor": 7, "computeMinor": 5}, "cuda", {"fp16"}),
        (A100, "cuda", {"fp16", "bf16", "tf32"}),
        ({"name": "NVIDIA L4", "computeMajor": 8, "computeMinor": 9}, "cuda", {"fp16", "bf16", "tf32", "fp8"}),
        (H100, "cuda", {"fp16", "bf16", "tf32", "fp8"}),
        (MI250, "rocm", {"fp16", "bf16"}),
        (MI300, "rocm", {"fp16", "bf16", "fp8"}),
    ],
)
def test_each_generation_has_the_matrix_units_its_vendor_documents(device: dict[str, Any], runtime: Any, formats: set[str]) -> None:
    model = Accelerator.of([device], runtime)
    assert model is not None
    assert {f for f in _FORMATS if model.has(f)} == formats
