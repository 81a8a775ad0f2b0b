"""The rank's pace just before its window: what the agent writes into its trace's top-level metadata under
:data:`STEPS_BEFORE_METADATA_KEY` and the analysis reads back.

A trace times the steps the profiler recorded, with the profiler on. What the profiler adds to each op (its own
record, and more with ``record_shapes``, ``with_stack``, ``profile_memory``) is read as the loop's own host time, and
on some loops it is most of the step: a LoRA fine-tune under transformers' Trainer on CPU ran 84 ms steps before
its window and 280-770 ms steps inside it with ``record_shapes=True`` (tests/data/record_cpu_pace.py), and the example
job's first windows ran 1.5-3.5x its pace with no option on. The agent's heartbeats already time the steps between
polls, with no profiler on and nothing on the step path; that measure up to the window, beside the window's own
steps, says how far the window's figures are the profiler's.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["STEPS_BEFORE_METADATA_KEY", "StepsBefore"]

STEPS_BEFORE_METADATA_KEY = "rayprof_steps_before"


class StepsBefore(StrictModel):
    """The rank's steps over the agent's last measure before the window was armed (no window open in it)."""

    step_ms: float = Field(gt=0, allow_inf_nan=False, description="Mean step time over the measure.")
    steps: int = Field(ge=1, description="Steps the measure spans.")
    span_s: float = Field(gt=0, allow_inf_nan=False, description="Time the measure spans.")
    windows_before: int = Field(
        default=0, ge=0, description="Windows the process closed before this one (0: its first, which pays first uses)."
    )
    options: list[str] = Field(
        default_factory=list,
        description="The window's profiler options that add to what each op costs it (TorchOptions.per_op_costs).",
    )
