"""The calls of a closure inside an optimizer step, read from a ``with_stack`` trace's Python frames.

``optimizer.step(closure)`` (LBFGS; Lightning's, skorch's and, by default, Composer's Trainer's steps) runs the
closure inside ``Optimizer.step#...`` and its own update after it. The phases give the model's forward and backward
their own time and the closure's work before the first backward to the forward (the model and the loss,
:mod:`~orchestrator.analysis.phases`); what a closure runs after its backward is the loop's own work, not the
optimizer's: Composer's Trainer updates its training metrics and reads the loss back there (1.3 ms of the 4.9 ms a
step its recording read as optimizer time, ``tests/data/traces/cpu_composer_stacks``). Without frames a step span
cannot be cut there, and the rest of it stays the optimizer's.

A closure's call is a frame of code outside torch, numpy and the standard library that begins inside an optimizer
step and is called by a ``step`` method of torch's own optimizers (``torch/optim/``): a wrapper such as
LightningOptimizer's opens before the step span does. A library optimizer's ``step`` calls its own helpers as it
calls a closure, so a closure it runs is not told apart: its step stays the optimizer's, as without frames.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.intervals import Intervals, membership, union
from orchestrator.analysis.python_frames import frame_parts, is_users
from orchestrator.traces.loader import Span

__all__ = ["closure_calls"]

_TORCH_OPTIM = "torch/optim/"


def closure_calls(frames: Sequence[Span], steps: Intervals) -> Intervals:
    """The intervals of closure calls inside ``steps`` (an optimizer step's spans) among one thread's ``frames``."""
    if not frames or not steps:
        return []
    in_step = membership(union(steps))
    calls: Intervals = []
    stack: list[Span] = []  # the frames open at the current one's start, innermost last
    for frame in sorted(frames, key=lambda f: (f.ts, -f.end)):
        while stack and stack[-1].end <= frame.ts:
            stack.pop()
        caller = frame_parts(stack[-1].name) if stack else None
        if caller is not None and caller[0].startswith(_TORCH_OPTIM) and caller[1].rsplit(".", 1)[-1] == "step" \
                and is_users(frame.name) and in_step(frame.ts):
            calls.append((frame.ts, frame.end))
        stack.append(frame)
    return union(calls)
