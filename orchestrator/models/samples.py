"""The training thread's Python stack, sampled while a window records: what the agent writes into its trace's
top-level metadata under :data:`FRAMES_METADATA_KEY` and the analysis reads back.

A trace without ``with_stack`` shows nothing where the training thread runs no op: a wait for Ray Data's next
batch or for Ray Train's ``report()`` reads as an empty stretch of the step. These samples say what ran there at a
cost of one stack walk every few milliseconds, during the window only.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from orchestrator.models.common import StrictModel

__all__ = ["FRAMES_METADATA_KEY", "FrameSamples"]

FRAMES_METADATA_KEY = "rayprof_frames"


class FrameSamples(StrictModel):
    """One window's samples of the training thread's stack: each distinct stack once, each sample a time and the
    stack it saw."""

    interval_ms: float = Field(gt=0, allow_inf_nan=False, description="How often the stack was sampled.")
    stacks: list[list[str]] = Field(
        description="Each distinct stack, innermost frame first, each frame named as a with_stack trace names it "
        "('ray/data/iterator.py(293): _create_iterator': its file below the import path, line, function), a method "
        "with its class where Python knows it (3.11 on: 'ray/data/iterator.py(293): DataIterator._create_iterator')."
    )
    samples: list[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]] = Field(
        description="(unix time in microseconds, index into stacks), in time order."
    )
    truncated: bool = Field(default=False, description="Sampling stopped at its cap before the window ended.")

    @model_validator(mode="after")
    def _indices_in_range(self) -> FrameSamples:
        if any(index >= len(self.stacks) for _, index in self.samples):
            raise ValueError(f"a sample names a stack past the {len(self.stacks)} given")
        return self
