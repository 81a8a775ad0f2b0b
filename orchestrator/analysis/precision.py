"""The precision a fix names, chosen for the device the trace names: bf16 and TF32 where it has matrix units for
them (Ampere, CDNA), fp16 with a GradScaler where it has them for fp16 only (Volta, Turing), fp8 only where it
has fp8 (Ada, Hopper, MI300). A trace without ``deviceProperties`` (or with mixed devices) gets the general words.
A trace without backward (``trains`` False: inference, evaluation) is told no training-only tool: no GradScaler, no
float8 training.
"""

from __future__ import annotations

from orchestrator.analysis.loop_settings import Change
from orchestrator.models.accelerator import Accelerator

__all__ = ["fp8_clause", "fp32_matmul_fix", "half_autocast", "half_changes", "half_format"]

_AUTOCAST = "torch.autocast(device_type='{device}', dtype=torch.{dtype})"


def _fp16_only(a: Accelerator | None) -> bool:
    return a is not None and a.has("fp16") and not a.has("bf16")


def fp32_matmul_fix(a: Accelerator | None, trains: bool, device: str = "cuda") -> str:
    """How fp32 matrix math gets cheaper on ``a``: the clause after "in fp32 by their names: "; ``device``: the rank's
    (an Intel GPU's autocast is torch.xpu's, and NVIDIA's generations name none of its)."""
    scaler = " with a torch.amp.GradScaler" if trains else ""
    if device == "xpu":
        return (
            f"run them in bf16 under {_AUTOCAST.format(device='xpu', dtype='bfloat16')}, or at least TF32 where the "
            "device has it (torch.set_float32_matmul_precision('high'))"
        )
    if a is not None and a.has("bf16") and a.has("tf32"):
        return (
            f"run them in bf16 under {_AUTOCAST.format(device='cuda', dtype='bfloat16')}, or at least TF32 "
            f"(torch.set_float32_matmul_precision('high')): the {a.label} has tensor cores for both"
        )
    if a is not None and a.has("bf16"):
        return f"run them in bf16 under {_AUTOCAST.format(device='cuda', dtype='bfloat16')}: the {a.label} has matrix cores for it"
    if a is not None and a.has("fp16"):
        return (
            f"run them in float16 under {_AUTOCAST.format(device='cuda', dtype='float16')}{scaler}: the "
            f"{a.label} has tensor cores for fp16 but none for bf16 or TF32, so bf16 gains nothing there"
        )
    return (
        f"run them in bf16 under {_AUTOCAST.format(device='cuda', dtype='bfloat16')} (float16{scaler} before Ampere), "
        "or at least TF32 on Ampere and later (torch.set_float32_matmul_precision('high'))"
    )


def fp8_clause(a: Accelerator | None, trains: bool) -> str:
    """Where matrix math is in 16 bits already, the fp8 step, as the first item of a list of fixes ('' where the
    device has no fp8 units: telling an A100 to train in fp8 names no change)."""
    how = (
        "Transformer Engine, torchao's float8 training"
        if trains
        else "torchao's float8 weight and activation quantization, or a serving engine's fp8 mode such as vLLM's"
    )
    if a is None:
        return f"fp8 where the device has it ({how}), "
    if a.has("fp8"):
        return f"fp8, which the {a.label} has matrix units for ({how}), "
    return ""


def half_format(a: Accelerator | None) -> str:
    """The 16-bit format to move data in: fp16 on a device without bf16 units, else bf16."""
    return "fp16" if _fp16_only(a) else "bf16"


def half_changes(a: Accelerator | None, tf32: bool = False) -> list[Change]:
    """Mixed precision as a framework's setting: fp16 on a device without bf16 units, else bf16 (and, with ``tf32``,
    TF32 where the device has it or is not known)."""
    if _fp16_only(a):
        return [Change.FP16]
    return [Change.BF16] + ([Change.TF32] if tf32 and (a is None or a.has("tf32")) else [])


def half_autocast(a: Accelerator | None) -> str:
    """Mixed precision in a fix's words: bf16 autocast, or fp16 autocast with a GradScaler on a device without bf16 units."""
    return "fp16 autocast with a GradScaler" if _fp16_only(a) else "bf16 autocast"
