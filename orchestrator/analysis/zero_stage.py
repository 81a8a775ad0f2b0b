"""Which ZeRO stage a DeepSpeed engine runs, read from the Python frames of the steps (a ``with_stack`` trace's, or the
agent's stack samples).

The stage decides where the gradients are reduced, so it decides the fix. DeepSpeed 0.19 reduces them after backward
at stage 0 (``DeepSpeedEngine.buffered_allreduce_fallback``) and at stage 1 (``DeepSpeedZeroOptimizer.reduce_gradients``,
once per accumulated step), and at stage 2 in its backward hooks when a bucket of ``reduce_bucket_size`` elements
fills, else in the epilogue after backward, on every micro-batch (``overlapping_partition_gradients_reduce_epilogue``
called by the engine itself, not by ``reduce_gradients``). Stage 3 runs ``DeepSpeedZeroOptimizer_Stage3``.

A sample holds a whole stack, so a stage-1 sample inside the epilogue holds ``reduce_gradients`` too; a ``with_stack``
trace holds every frame: a ``reduce_gradients`` frame anywhere means stage 1 in both. None where no frame tells (no
stacks, or no sample landed in the engine's reduction).
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.analysis.python_frames import frame_parts
from orchestrator.traces.loader import Span

__all__ = ["zero_stage"]

_ZERO = "deepspeed/runtime/zero/"
_STAGE_1_OR_2 = f"{_ZERO}stage_1_and_2.py"
_ENGINE = "deepspeed/runtime/engine.py"


def zero_stage(frames: Iterable[Span]) -> int | None:
    """The ZeRO stage of the DeepSpeed engine whose frames are among ``frames``, or None where they do not tell."""
    seen: set[tuple[str, str]] = set()
    for f in frames:
        parts = frame_parts(f.name)
        if parts is not None and parts[0].startswith("deepspeed/"):
            # A sample names a method by its qualified name, a with_stack trace by the function's alone.
            seen.add((parts[0], parts[1].rsplit(".", 1)[-1]))
    if any(file == f"{_ZERO}stage3.py" for file, _ in seen):
        return 3
    if (_STAGE_1_OR_2, "reduce_gradients") in seen:
        return 1
    if (_STAGE_1_OR_2, "overlapping_partition_gradients_reduce_epilogue") in seen:
        return 2
    if (_ENGINE, "buffered_allreduce_fallback") in seen:
        return 0
    return None
