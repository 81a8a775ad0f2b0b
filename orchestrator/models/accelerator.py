"""The device model a rank's trace names, and the number formats it has fast matrix units for.

Advice that names a precision must name one the device computes fast: a V100 has tensor cores for fp16 but none
for bf16 or TF32 (autocast to bf16 runs slower there than fp32), an A100 has none for fp8. Kineto writes each
device's name and compute capability into the trace's ``deviceProperties``; on ROCm the capability is the gfx
architecture's (9.0 for MI100/MI200's gfx908/gfx90a, 9.4 for MI300's gfx942).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Accelerator"]

# Compute capabilities where a format gets matrix units: NVIDIA's Volta (fp16), Ampere (bf16, TF32), Ada and
# Hopper (fp8); AMD's CDNA (bf16 from gfx908) and CDNA 3 (fp8 from gfx942).
_FIRST: dict[tuple[str, str], tuple[int, int]] = {
    ("cuda", "fp16"): (7, 0),
    ("cuda", "bf16"): (8, 0),
    ("cuda", "tf32"): (8, 0),
    ("cuda", "fp8"): (8, 9),
    ("rocm", "fp16"): (9, 0),
    ("rocm", "bf16"): (9, 0),
    ("rocm", "fp8"): (9, 4),
}
_MAX_NAME = 120


class Accelerator(BaseModel):
    """One device model (every device in the trace's ``deviceProperties`` is of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=_MAX_NAME, description="As the driver names it: 'Tesla V100-SXM2-32GB'.")
    runtime: Literal["cuda", "rocm"]
    capability: tuple[int, int] = Field(description="Compute capability (major, minor); ROCm's is its gfx architecture's.")

    @classmethod
    def of(cls, properties: list[dict[str, Any]], runtime: Literal["cuda", "rocm", "mtia", "xpu", "cpu"]) -> Accelerator | None:
        """The model of a CUDA or ROCm trace's devices; None when the trace names none, names two different ones,
        or names one with a capability no device has (``deviceProperties`` is whatever the file holds)."""
        if runtime != "cuda" and runtime != "rocm":
            return None
        models = {_model(p) for p in properties}
        if len(models) != 1:
            return None
        (model,) = models
        if model is None:
            return None
        name, major, minor = model
        return cls(name=name, runtime=runtime, capability=(major, minor))

    def has(self, fmt: Literal["fp16", "bf16", "tf32", "fp8"]) -> bool:
        """Whether the device has matrix units for ``fmt`` (TF32 is claimed for NVIDIA's only)."""
        first = _FIRST.get((self.runtime, fmt))
        return first is not None and self.capability >= first

    @property
    def label(self) -> str:
        """'Tesla V100-SXM2-32GB (sm_70)'; on ROCm the name alone (its capability is not its gfx name)."""
        major, minor = self.capability
        return f"{self.name} (sm_{major}{minor})" if self.runtime == "cuda" else self.name


def _model(properties: dict[str, Any]) -> tuple[str, int, int] | None:
    """One device's name and capability, or None where either is not one a device could have."""
    name, major, minor = properties.get("name"), properties.get("computeMajor"), properties.get("computeMinor")
    if not (isinstance(name, str) and 0 < len(name.strip()) <= _MAX_NAME):
        return None
    if not (major.__class__ is int and minor.__class__ is int and 0 <= major < 100 and 0 <= minor < 100):
        return None
    return name.strip(), major, minor
