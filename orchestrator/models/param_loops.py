"""A loop over tensors one op at a time outside the model and the optimizer, as a rank's summary keeps it
(:mod:`orchestrator.analysis.param_loops` finds it)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["ParamLoop"]


class ParamLoop(StrictModel):
    """The longest such loop of each step: the same few ops again and again, on one tensor after another."""

    ops: list[str] = Field(min_length=1, description="One iteration's ops, in order (aten::sub, aten::mul, aten::sub_).")
    iterations: list[int] = Field(description="Per step: the loop's iterations; 0 where the step runs none.")
    ms: list[float] = Field(description="Per step: the loop's time, its first op's start to its last op's end.")
    owner: str | None = Field(
        default=None, description="The Python function that runs it, by the stack samples or with_stack frames "
        "(a Kineto frame name, '<file>(<line>): <function>'); None where neither shows one."
    )
    stretches: list[tuple[float, float]] = Field(
        default_factory=list, description="Where it runs in the trace: each stretch's first op's start and last "
        "op's end (µs, the trace's clock), in order."
    )
