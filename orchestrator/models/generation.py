"""The step's own rollouts, as a rank's summary keeps them (:mod:`orchestrator.analysis.generation` finds them): text
generated with transformers' ``generate``, or environments stepped by stable-baselines3's ``collect_rollouts``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["Generation"]


class Generation(StrictModel):
    """An RL loop's rollouts running in the steps, by the stack samples or with_stack frames: transformers' ``generate``
    (an RL fine-tune's completions) or stable-baselines3's ``collect_rollouts`` (environments stepped)."""

    kind: Literal["text", "env"] = Field(
        default="text", description="text: transformers' generate; env: stable-baselines3's collect_rollouts."
    )
    ms: list[float] = Field(description="Per step: the time the training thread spent inside the rollout.")
    stretches: list[tuple[float, float]] = Field(
        default_factory=list, description="Where it runs in the trace: each stretch's start and end (µs, the trace's "
        "clock), in order."
    )
    caller: str | None = Field(
        default=None, description="text: the innermost frame outside transformers that called generate; env: the "
        "collect_rollouts frame (a Kineto frame name, '<file>(<line>): <function>'). None where no frame encloses it."
    )
