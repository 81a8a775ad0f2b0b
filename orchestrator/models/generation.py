"""Text generation inside the training steps, as a rank's summary keeps it (:mod:`orchestrator.analysis.generation`
finds it)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["Generation"]


class Generation(StrictModel):
    """transformers' ``generate`` running in the steps (an RL fine-tune's rollouts), by the stack samples or
    with_stack frames."""

    ms: list[float] = Field(description="Per step: the time the training thread spent inside generate.")
    stretches: list[tuple[float, float]] = Field(
        default_factory=list, description="Where it runs in the trace: each stretch's start and end (µs, the trace's "
        "clock), in order."
    )
    caller: str | None = Field(
        default=None, description="The innermost frame outside transformers that called generate (a Kineto frame "
        "name, '<file>(<line>): <function>'); None where no frame encloses it."
    )
