"""The device's idle time cut by what the host did meanwhile, as the analysis reports it (re-exported by
:mod:`orchestrator.models.analysis`, whose ``RankSummary`` holds it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["IDLE_CAUSES", "IDLE_LABELS", "IdleAttribution", "IdleCause", "IdleShare", "OpStat"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


IdleCause = Literal[
    "data", "anomaly", "sync", "copy", "collective", "late_rank", "capture", "compile", "runtime", "cpu", "launch", "queued",
    "untraced",
]
IDLE_CAUSES: tuple[IdleCause, ...] = (
    "data", "anomaly", "sync", "copy", "collective", "late_rank", "capture", "compile", "runtime", "cpu", "launch", "queued",
    "untraced",
)
# What each cause means, in the words the report and the console show.
IDLE_LABELS: dict[IdleCause, str] = {
    "data": "the host waits for the DataLoader",
    "anomaly": "autograd's anomaly detection checks a gradient for NaN and reads the answer, or the host launches again "
    "after that read",
    "sync": "the host waits in a sync or device-to-host read, or launches again after one (the queue ran dry)",
    "copy": "the host is blocked in a host-to-device copy",
    "collective": "the host waits in a collective",
    "late_rank": "a collective waits for a late rank",
    "capture": "the host records a CUDA/HIP graph (its kernels run only when the graph is replayed)",
    "compile": "torch.compile compiles (Dynamo tracing, Inductor code generation, autotuning)",
    "runtime": "the host is in the device runtime's calls (allocator, slow launches, events, streams)",
    "cpu": "the host runs Python / CPU ops",
    "launch": "launch-bound: kernels are launched no faster than they run",
    "queued": "work is queued but waits on the device (stream/event dependency)",
    "untraced": "nothing profiled on the launching thread",
}


class OpStat(_Model):
    """An operator (self time on the host) or a GPU kernel, summed over the profiled steps."""

    name: str
    calls: int
    total_ms: float


class IdleShare(_Model):
    """The device idle time one cause explains, per analysed step."""

    cause: IdleCause
    label: str = Field(description="The cause in words, as the report and the console show it.")
    ms_per_step: float
    fraction_of_step: float
    top: list[OpStat] = Field(
        default_factory=list,
        description="cpu / runtime: the host ops or runtime calls (innermost span) the device idles during; queued: the runtime "
        "calls that launched the work that waits (cudaGraphLaunch for a graph's nodes); summed over the steps.",
    )
    regions: list[OpStat] = Field(
        default_factory=list,
        description="cpu: the optimizer steps and record_function regions the host is in while the device idles, summed over the steps.",
    )
    model_ops: list[OpStat] = Field(
        default_factory=list,
        description="cpu: the host ops (innermost span) the device idles during outside every optimizer step and record_function "
        "region (the model's own ops), the largest, summed over the steps.",
    )
    model_ops_ms: float = Field(0.0, description="cpu: the time of all those ops, summed over the steps.")
    host_only_ops: list[str] = Field(
        default_factory=list,
        description="cpu: those of model_ops no call of which launched device work (a kernel, copy or memset): they "
        "compute on CPU tensors while the device idles. Allocation and view ops, which compute nothing, are left out.",
    )
    host_op_callers: list[OpStat] = Field(
        default_factory=list,
        description="cpu, in a with_stack trace: the innermost frames of the user's or a library's code around the calls "
        "of the largest of host_only_ops, with their time, summed over the steps.",
    )
    python_frames: list[OpStat] = Field(
        default_factory=list,
        description="cpu, in a with_stack trace: the Python functions (innermost frame of the user's or a library's code, not "
        "torch's, numpy's or the standard library's) the host runs outside any op, optimizer step and record_function region "
        "while the device idles, the largest, summed over the steps.",
    )
    python_frames_ms: float = Field(0.0, description="cpu: the time of all those functions, summed over the steps.")


class IdleAttribution(_Model):
    """Every idle gap of the device, cut by what the launching host thread (and the other ranks) did during it."""

    idle_ms_per_step: float
    causes: list[IdleShare] = Field(description="Largest first; only causes with idle time.")

    def ms(self, *causes: IdleCause) -> float:
        """Idle ms per step explained by ``causes``."""
        return sum(c.ms_per_step for c in self.causes if c.cause in causes)

    def get(self, cause: IdleCause) -> IdleShare | None:
        return next((c for c in self.causes if c.cause == cause), None)
