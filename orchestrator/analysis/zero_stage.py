"""Which ZeRO stage a DeepSpeed engine runs (and whether through ``BF16_Optimizer``), read from the Python frames of
the steps (a ``with_stack`` trace's, or the agent's stack samples).

The stage decides where the gradients are reduced, so it decides the fix. DeepSpeed 0.19 reduces them after backward
at stage 0 (``DeepSpeedEngine.buffered_allreduce_fallback``) and at stage 1 (``DeepSpeedZeroOptimizer.reduce_gradients``,
once per accumulated step), and at stage 2 in its backward hooks when a bucket of ``reduce_bucket_size`` elements
fills, else in the epilogue after backward, on every micro-batch (``overlapping_partition_gradients_reduce_epilogue``
called by the engine itself, not by ``reduce_gradients``). Stage 3 runs ``DeepSpeedZeroOptimizer_Stage3``.

A sample holds a whole stack, so a stage-1 sample inside the epilogue holds ``reduce_gradients`` too; a ``with_stack``
trace holds every frame: a ``reduce_gradients`` frame anywhere means stage 1 in both. None where no frame tells (no
stacks, or no sample landed in the engine's reduction); sparse samples that miss ``BF16_Optimizer``'s own frames read
its reduction as stage 0's.

bf16 weights with fp32 gradient accumulation (``"data_types": {"grad_accum_dtype": "fp32"}``) at stage 1, or under
pipeline parallelism at stage 0, run ``BF16_Optimizer``: it reduces through the engine's
``buffered_allreduce_fallback`` after backward whatever ``overlap_comm`` and ``reduce_bucket_size`` say (measured on
DeepSpeed 0.19.8), so its stage is not read from that call, and its fix is its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from orchestrator.analysis.python_frames import frame_parts
from orchestrator.traces.loader import Span

__all__ = ["Zero", "zero_of"]

_ZERO = "deepspeed/runtime/zero/"
_STAGE_1_OR_2 = f"{_ZERO}stage_1_and_2.py"
_ENGINE = "deepspeed/runtime/engine.py"
_BF16 = "deepspeed/runtime/bf16_optimizer.py"


class Zero(NamedTuple):
    """How a DeepSpeed engine reduces the gradients, as its frames tell."""

    stage: int | None
    bf16_optimizer: bool


def zero_of(frames: Iterable[Span]) -> Zero:
    """The ZeRO stage of the DeepSpeed engine whose frames are among ``frames`` (None where they do not tell), and
    whether it runs ``BF16_Optimizer``."""
    seen: set[tuple[str, str]] = set()
    for f in frames:
        parts = frame_parts(f.name)
        if parts is not None and parts[0].startswith("deepspeed/"):
            # A sample names a method by its qualified name, a with_stack trace by the function's alone.
            seen.add((parts[0], parts[1].rsplit(".", 1)[-1]))
    files = {file for file, _ in seen}
    if _BF16 in files:  # stage 1, or stage 0 under pipeline parallelism: its reduction does not say which
        return Zero(None, True)
    if f"{_ZERO}stage3.py" in files:
        return Zero(3, False)
    if (_STAGE_1_OR_2, "reduce_gradients") in seen:
        return Zero(1, False)
    if (_STAGE_1_OR_2, "overlapping_partition_gradients_reduce_epilogue") in seen:
        return Zero(2, False)
    return Zero(0 if (_ENGINE, "buffered_allreduce_fallback") in seen else None, False)
