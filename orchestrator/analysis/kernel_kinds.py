"""What a busy device spends its time on, by kind of kernel, read from the kernel names: the GPU-bound finding's
fix is the one for the kind that leads, not a list of every fix there is.

A kernel's name says what it computes (cuBLAS/cuDNN/CUTLASS/rocBLAS GEMMs and convolutions, FlashAttention,
ATen's elementwise and reduction kernels, normalization, FBGEMM's embedding kernels, Triton kernels that
``torch.compile`` generated) and often in what precision (``volta_sgemm``, ``dgrad_engine<float, ...>`` are fp32;
``e4m3``, ``mxfp4``, ``i8i8`` are 8 bits or fewer).
Kernels the names do not place (MTIA's, custom ones) are ``other``: the fix for them stays general. Collective
kernels are the communication findings', not a kernel to tune, and are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.precision import fp8_clause, fp32_matmul_fix, half_changes, half_format
from orchestrator.analysis.spans import is_comm_kernel_name
from orchestrator.loops import Loop
from orchestrator.models.accelerator import Accelerator
from orchestrator.models.analysis import OpStat, RankSummary

__all__ = ["KindTime", "device_work_fix", "kernel_kind", "kinds", "short_name"]

Kind = Literal["attention", "embedding", "compiled", "matmul", "memory", "other"]
# First match wins: attention and embedding kernels contain GEMM-like words, Triton kernels ATen-like ones, and
# GEMMs memory-like ones (cuDNN's ``wgrad_indexed_implicit_gemm``).
_KINDS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa", re.IGNORECASE)),
    ("embedding", re.compile(r"embedding", re.IGNORECASE)),
    ("compiled", re.compile(r"^triton_")),
    ("matmul", re.compile(r"gemm|xmma|cutlass|cublas|(?:^|_)Cijk_|hipblaslt|matmul|conv(?!ert)|dgrad|wgrad|fprop|winograd|scudnn", re.IGNORECASE)),
    ("memory", re.compile(
        r"elementwise|reduce_kernel|CatArrayBatchedCopy|softmax|norm|bn_fw|bn_bw|welford|multi_tensor_apply|index|scatter|gather|"
        r"copy_kernel|fill_kernel|max_pool|avg_pool|nchwToNhwc|nhwcToNchw|transpose|TensorOp|cast",
        re.IGNORECASE,
    )),
)
# Names that say fp32 math: cuBLAS's SGEMMs, cuDNN's scudnn / float-templated engines, CUTLASS/xmma FFMA kernels,
# Tensile's (rocBLAS / hipBLASLt) ``Cijk_<indices>_SB_`` (the type code after the indices: SB single, HB half, BBS bf16).
_FP32 = re.compile(r"sgemm|scudnn|^void cudnn::\w+(::\w+)*<float,|engine<float,|f32f32_f32f32_f32|^Cijk_[A-Za-z]+_[A-Za-z]+_SB_")
# Names that say 8-bit or narrower operands: cuBLASLt/CUTLASS fp8 (``e4m3``, ``e5m2``), microscaling and NVIDIA's fp4
# (``mxfp4``, ``nvfp4``, Triton's ``bf16xmxfp4``, FBGEMM's ``f8f8bf16``), int8/int4 GEMMs (``i8i8``, ``s8s8``, ``w8a8``, ``w4a16``, CUTLASS's ``i16832gemm``), and
# Tensile's type codes F8 / B8 / I8 (hipBLASLt's ``Cijk_Alik_Bljk_F8BS_``, ``Custom_Cijk_Alik_Bljk_F8B8BS_``).
_LOW_PRECISION = re.compile(
    r"fp8|fp4|fp6|f8f8|e4m3|e5m2|e2m1|int8|int4|i8i8|s8s8|u8s8|w8a8|w4a8|w4a16|i\d{4,5}gemm|(?-i:(?:^|_)Cijk_[A-Za-z]+_[A-Za-z]+_[FBI]8)", re.IGNORECASE
)
# Convolution kernels by their names: cuDNN's engines and implicit GEMMs, MIOpen's, Winograd's.
_CONVOLUTION = re.compile(r"conv(?!ert)|dgrad|wgrad|fprop|winograd|scudnn|implicit_gemm|miopen", re.IGNORECASE)
# Names that say 16-bit data: ATen's templates (``c10::BFloat16``, ``c10::Half``), CUTLASS's and cuBLAS's
# (``bfloat16_t``, ``__half``, ``bf16``), ROCm's (``batched_transpose_16x32_half``).
_HALF = re.compile(r"bfloat16|c10::half|__half|bf16|fp16|(?:^|_)half(?:_|$)", re.IGNORECASE)
_GROUPED = re.compile(r"grouped", re.IGNORECASE)
# Namespaces of the kernels torch and the vendor libraries it calls ship (ATen's, CUTLASS's own, cuBLAS's, cuDNN's,
# CUB's, torch's bundled FlashAttention): a kernel in any other namespace comes from a library the job brought.
_STOCK_NAMESPACES = frozenset({"at", "c10", "cutlass", "cute", "cublas", "cublasLt", "cudnn", "cub", "internal", "pytorch_flash"})
_LABELS = {
    "attention": "attention kernels",
    "embedding": "embedding lookups and their backward",
    "compiled": "kernels torch.compile generated",
    "matmul": "matrix multiplies and convolutions",
    "memory": "memory-bound kernels (elementwise, reductions, normalization, copies)",
    "other": "other kernels",
}


def kernel_kind(name: str) -> Kind:
    return next((kind for kind, pattern in _KINDS if pattern.search(name)), "other")


@dataclass(frozen=True)
class KindTime:
    """One kind's device ms per step among the rank's top kernels, and those kernels, largest first."""

    kind: Kind
    ms: float
    kernels: tuple[OpStat, ...]

    @property
    def fp32(self) -> bool:
        """Most of its time is in kernels whose names say fp32."""
        return self._mostly(_FP32)

    @property
    def low_precision(self) -> bool:
        """Most of its time is in kernels whose names say 8-bit or narrower operands (fp8, fp4, int8)."""
        return self._mostly(_LOW_PRECISION)

    @property
    def half(self) -> bool:
        """Most of its time is in kernels whose names say 16-bit data (bf16, fp16)."""
        return self._mostly(_HALF)

    @property
    def library(self) -> str | None:
        """The namespace of a kernel library of the job's own (DeepSeek's ``dpsk::``, TransformerEngine's) that
        most of its time is in: torch.compile and cuBLAS's heuristics choose none of those kernels."""
        by_library: dict[str, float] = {}
        for k in self.kernels:
            if (name := _own_library(k.name)) is not None:
                by_library[name] = by_library.get(name, 0.0) + k.total_ms
        name, ms = max(by_library.items(), key=lambda item: item[1], default=(None, 0.0))
        return name if 2 * ms > sum(k.total_ms for k in self.kernels) else None

    @property
    def grouped(self) -> bool:
        """Most of its time is in grouped GEMMs (a mixture of experts' per-expert matrix multiplies)."""
        return self._mostly(_GROUPED)

    @property
    def convolutions(self) -> bool:
        """Some of its kernels are convolutions (cuDNN's, MIOpen's): channels_last is a fix for them alone."""
        return any(_CONVOLUTION.search(k.name) for k in self.kernels)

    def _mostly(self, names: re.Pattern[str]) -> bool:
        return 2 * sum(k.total_ms for k in self.kernels if names.search(k.name)) > sum(k.total_ms for k in self.kernels)


def kinds(r: RankSummary) -> list[KindTime]:
    """The rank's top kernels (collectives left out) by kind, largest first, in ms per step."""
    n = max(len(r.steps), 1)
    grouped: dict[Kind, list[OpStat]] = {}
    for k in r.top_kernels:
        if not is_comm_kernel_name(k.name):
            grouped.setdefault(kernel_kind(k.name), []).append(k)
    out = [KindTime(kind, sum(k.total_ms for k in ks) / n, tuple(ks)) for kind, ks in grouped.items()]
    return sorted(out, key=lambda t: -t.ms)


# CUTLASS's launch wrappers: every CUTLASS 2/3 kernel (FlashAttention 3's, DeepGEMM's) is one of these, named by its
# first template argument.
_WRAPPER = re.compile(r"^cutlass::(device_kernel|Kernel2?)<")


def short_name(name: str) -> str:
    """A kernel's name without its return type, template and parameter lists: ``cudnn::detail::dgrad_engine``;
    a CUTLASS wrapper's by what it wraps: ``flash::FlashAttnBwd`` for ``cutlass::device_kernel<flash::FlashAttnBwd<...>>``."""
    bare = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    if (wrapper := _WRAPPER.match(bare)) is not None and (inner := bare[wrapper.end() :].strip()):
        bare = inner
    return re.split(r"[<(>,]", bare, maxsplit=1)[0].strip()[:60] or bare[:60]


_CHANNELS_LAST = "; channels_last for the convolutions (model.to(memory_format=torch.channels_last) and its inputs)"
_BY_HAND = (
    " A softmax leads them: if it is attention written by hand (softmax(QKᵀ)V), "
    "torch.nn.functional.scaled_dot_product_attention runs it as one fused kernel that never writes the attention matrix."
)


def _own_library(name: str) -> str | None:
    """The leading namespace of a kernel's :func:`short_name` when it is none of torch's or the vendor libraries'."""
    head, sep, _ = short_name(name).partition("::")
    return head if sep and head not in _STOCK_NAMESPACES else None


def _softmax_leads(t: KindTime) -> bool:
    """Half the kind's time or more is in plain softmax kernels (not log_softmax: that is the loss's)."""
    ms = sum(k.total_ms for k in t.kernels if "softmax" in k.name.lower() and "logsoftmax" not in k.name.lower())
    return 2 * ms >= sum(k.total_ms for k in t.kernels)


def _fix(
    t: KindTime, step_ms: float, fused_attention: bool, device: Accelerator | None, trains: bool, loop: Loop | None, on: str
) -> str:
    names = ", ".join(dict.fromkeys(short_name(k.name) for k in t.kernels[:3]))
    label = "matrix multiplies" if t.kind == "matmul" and not t.convolutions else _LABELS[t.kind]
    figure = f"{label.capitalize()} take {t.ms:.1f} ms a step ({t.ms / step_ms:.0%} of it; {names})"
    if t.kind == "matmul" and t.fp32:
        return (
            f"{figure}, in fp32 by their names: {fp32_matmul_fix(device, trains, on)}{_CHANNELS_LAST if t.convolutions else ''}."
            + in_loop(loop, half_changes(device, tf32=True))
        )
    if t.kind == "matmul" and t.low_precision:
        # Precision is spent already: telling an fp4/fp8 job to try fp8 names no change. Kernels of a library of the
        # job's own (DeepSeek's grouped GEMMs) are that library's to tune: torch.compile does not pick them.
        padded = "each expert's token count in the grouped GEMMs" if t.grouped else "pad the vocabulary"
        whose = f", in {t.library}'s own kernels, which torch.compile does not choose" if t.library else ""
        tuning = "" if t.library else ", torch.compile(mode='max-autotune') to pick the GEMM kernels"
        return (
            f"{figure}, in 8-bit or narrower precision by their names already: the math itself is the cost{whose}: "
            f"shapes in multiples of 128 so every tile is full ({padded}){tuning}, or fewer FLOPs (a smaller model, sparsity)."
        )
    if t.kind == "matmul":
        return (
            f"{figure}, not fp32 by their names: the math itself is the cost: {fp8_clause(device, trains)}dimensions in multiples "
            f"of 64 (pad the vocabulary){_CHANNELS_LAST if t.convolutions else ''}."
        )
    if t.kind == "memory":
        return (
            f"{figure}: each reads and writes memory for little math; torch.compile fuses chains of them into few "
            "kernels, fused LayerNorm/RMSNorm kernels do the same by hand"
            + ("" if t.half else f", and {half_format(device)} instead of fp32 halves the bytes they move")
            + "."
            + (_BY_HAND if _softmax_leads(t) and not fused_attention else "")
            + in_loop(loop, [Change.COMPILE, *([] if t.half else half_changes(device))])
        )
    if t.kind == "attention":
        return (
            f"{figure}, fused kernels already: their cost grows with the square of the sequence length: no padding "
            "(pack sequences), sliding-window or sparse attention, fewer key/value heads (grouped-query attention)."
        )
    if t.kind == "embedding":
        return (
            f"{figure}: their time follows the rows looked up and their width and precision: fp16 or int8 tables "
            "(FBGEMM/TorchRec), deduplicated indices, and tables sharded so each rank looks up fewer rows."
        )
    if t.kind == "compiled":
        return (
            f"{figure}: already fused by torch.compile: mode='max-autotune' tunes them and the GEMMs they sit beside; "
            f"beyond that, fewer FLOPs or bytes ({half_format(device)}, a smaller model)."
        )
    return (
        f"The kernels that lead ({names}) do not say by their names what they compute: look them up in the trace; in "
        "general, bf16/fp8 autocast, torch.compile to fuse small kernels, SDPA for attention."
    )


def device_work_fix(
    found: list[KindTime], step_ms: float, runner_up_fraction: float, device: Accelerator | None, trains: bool,
    loop: Loop | None = None, on: str = "cuda",
) -> str:
    """The fix for the kind of kernel (``found``: :func:`kinds`) that takes most of the busy device's time, and for
    the runner-up when it takes at least ``runner_up_fraction`` of the ``step_ms`` step, in precisions ``device`` has
    and with tools for training or, where the steps run no backward (``trains`` False), for inference; as ``loop``'s
    settings too where a framework runs it; ``on``: the rank's device (cuda, rocm, xpu...)."""
    if not found or step_ms <= 0:
        return "Make the device work cheaper: bf16/fp8 autocast, torch.compile to fuse small kernels, SDPA for attention."
    # A runner-up the names do not place has no fix of its own to add.
    told = [found[0], *(t for t in found[1:2] if t.ms >= runner_up_fraction * step_ms and t.kind != "other")]
    fused_attention = any(t.kind == "attention" for t in found)
    return " ".join(_fix(t, step_ms, fused_attention, device, trains, loop, on) for t in told)
