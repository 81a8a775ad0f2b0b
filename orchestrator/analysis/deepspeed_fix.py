"""What a DeepSpeed engine's own reduction after backward is told: the config keys, for the ZeRO stage its frames show
(:mod:`orchestrator.analysis.zero_stage`), that move the reduction into backward, or why it stays after."""

from __future__ import annotations

from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.loops import Loop
from orchestrator.models.analysis import RankSummary

__all__ = ["deepspeed_reduces", "deepspeed_reduction"]

# The stages (None: the frames did not tell) at which the engine reduces after backward, and why.
_AFTER_BACKWARD = {
    0: "reducing the gradients (without ZeRO it always reduces them after backward).",
    1: "reducing the gradients once per step at ZeRO stage 1: a bucket is reduced during backward only with "
    '"overlap_comm" and once it fills, and the default "reduce_bucket_size" (5e8 elements) holds every gradient of '
    "a smaller model until backward ends.",
    2: "reducing the gradients of every micro-batch at ZeRO stage 2: a bucket is reduced during backward only once it "
    'fills, and the default "reduce_bucket_size" (5e8 elements) holds every gradient of a smaller model until backward '
    "ends. Stage 1 reduces once per accumulated step where the memory for whole gradients on each rank allows.",
    None: "reducing the gradients: at ZeRO stage 0 always, and at stages 1 and 2 while a bucket of "
    '"reduce_bucket_size" elements (5e8 by default) holds every gradient of the model, so none fills during backward.',
}


def deepspeed_reduction(r: RankSummary) -> str:
    """Why the engine reduces after backward at the rank's ZeRO stage, and its config's keys that move the reduction
    into backward; at stage 3 (the gradients reduce-scattered during backward) what it reduces after."""
    stage = r.zero_stage
    if r.zero_bf16_optimizer:
        return (
            "reducing the gradients through its BF16_Optimizer (bf16 weights with fp32 gradient accumulation), which "
            'reduces them after backward whatever "overlap_comm" and "reduce_bucket_size" say. Where the job runs no '
            'pipeline parallelism, ZeRO stage 2 reduces buckets during backward as they fill: "zero_optimization": '
            '{"stage": 2, "overlap_comm": true, "reduce_bucket_size": N} with N well below the model\'s parameter '
            "count (it reduces on every micro-batch of an accumulation)." + in_loop(Loop.DEEPSPEED, [Change.COMPRESS_GRADIENTS])
        )
    if stage == 3:
        return (
            "all-reducing what it computes over the gradients (their norm, an overflow check) once ZeRO stage 3 has "
            "reduce-scattered them during backward: one round trip across the ranks per optimizer step."
            + in_loop(Loop.DEEPSPEED, [Change.ACCUMULATE])
        )
    return _AFTER_BACKWARD[stage] + in_loop(Loop.DEEPSPEED, [Change.GRADIENT_BUCKETS, Change.ACCUMULATE, Change.COMPRESS_GRADIENTS])


def deepspeed_reduces(r: RankSummary) -> bool:
    """A DeepSpeed engine reduces the rank's gradients: its loop is DeepSpeed's, or its frames show the engine's
    reduction under another owner (a transformers Trainer given a DeepSpeed config), whose keys are DeepSpeed's."""
    return r.loop is Loop.DEEPSPEED or r.zero_stage is not None or r.zero_bf16_optimizer
