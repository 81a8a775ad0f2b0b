"""What a user asks for: a profile request, its options, and the states a profile and a rank go through."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field

from orchestrator.models.common import Name, StrictModel

# torch.profiler's activities a window may ask for by name: the CPU, and the accelerators (cuda: NVIDIA's and AMD's
# GPUs, as torch's HIP build keeps CUDA's names; xpu: Intel's).
Activity = Literal["cpu", "cuda", "xpu"]
ACCELERATOR_ACTIVITIES: tuple[Activity, ...] = ("cuda", "xpu")
# torch.profiler's options that add to what the profiler costs each op it records, beyond its own record of it.
PER_OP_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


class ProfileState(str, enum.Enum):
    """Life of a profile request: PENDING -> SCHEDULED -> CAPTURING -> COLLECTING -> terminal."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    CAPTURING = "CAPTURING"
    COLLECTING = "COLLECTING"
    DONE = "DONE"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_PROFILE_STATES


_TERMINAL_PROFILE_STATES = frozenset(
    {ProfileState.DONE, ProfileState.PARTIAL, ProfileState.FAILED, ProfileState.CANCELLED}
)


class RankState(str, enum.Enum):
    """One rank's part in a profile."""

    WAITING = "WAITING"
    ARMED = "ARMED"
    CAPTURING = "CAPTURING"
    UPLOADING = "UPLOADING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (RankState.DONE, RankState.FAILED, RankState.CANCELLED)


class TorchOptions(StrictModel):
    """What a window records: ``torch.profiler.profile``'s arguments (one field per argument of
    the same name), and the CUDA caching allocator's history (``memory_snapshot``)."""

    activities: list[Activity] | None = Field(
        default=None,
        description="Default: cpu, plus the worker's accelerator: cuda (NVIDIA or AMD) or xpu (Intel).",
    )
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    memory_snapshot: bool = Field(
        default=False,
        description="Record the CUDA caching allocator's history over the window's steps and store each "
        "rank's snapshot (torch's pickle, and a page that needs no internet); CUDA workers only.",
    )

    def profiler_kwargs(self) -> dict[str, bool]:
        """The arguments ``torch.profiler.profile`` takes as they are (activities are mapped by the agent)."""
        return self.model_dump(exclude={"activities", "memory_snapshot"})

    def per_op_costs(self) -> list[str]:
        """The options on that add to what each recorded op costs (:data:`PER_OP_OPTIONS`)."""
        return [name for name in PER_OP_OPTIONS if getattr(self, name)]


class ProfileOptions(TorchOptions):
    """A window's length and reach, plus what to record."""

    steps: int = Field(ge=1, description="Optimizer steps to record on every rank.")
    warmup: int = Field(default=0, ge=0, description="Profiler warmup steps before the window.")
    ranks: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, description="World ranks to profile; default all (an empty list is refused)."
    )
    timeout_s: float | None = Field(
        # Finite: inf (or 1e400, which JSON reads as inf) has no deadline and no JSON form to send.
        default=None, gt=0, allow_inf_nan=False, description="Give up on ranks that have not reported by then."
    )
    queue: bool = Field(
        default=False, description="Wait behind a running window instead of failing with 409."
    )

    def torch_options(self) -> TorchOptions:
        """The part of these options that ``torch.profiler.profile`` takes."""
        return TorchOptions(**{name: getattr(self, name) for name in TorchOptions.model_fields})


class ProfileRequest(ProfileOptions):
    """``POST /v1/profiles`` body and ``ProfilingClient.profile`` arguments."""

    target: Name
    run: Name | None = Field(
        default=None,
        description="The run's Ray job (submission id or job id) when two live runs share the target name; "
        "default the newest.",
    )


