"""Forward, backward and optimizer time on the main thread, from how its spans nest.

The innermost recognised span decides each instant, not a fixed order of names:
a closure optimizer (``LBFGS``, Lightning's ``optimizer.step(closure)``) runs the
model's forward and backward inside ``Optimizer.step#...``, and that time is
forward and backward; only the optimizer's own remainder is optimizer time.

* backward: an autograd node or a span that names backward (:func:`spans.is_backward`,
  which covers ``CompiledFunctionBackward`` and compiled autograd's regions); on a
  GPU, also the time an ``Optimizer.step`` runs no op of its own while the autograd
  engine's device thread runs backward (the closure's ``loss.backward()``);
* forward: a module forward span (:func:`spans.is_forward`), and the time an
  ``Optimizer.step`` spends before the first backward inside it (the closure's
  model and loss, which need carry no marker); not a module forward inside a
  backward span: that is activation checkpointing recomputing the forward for
  backward (``torch.utils.checkpoint``, a Trainer's ``gradient_checkpointing``),
  backward's cost, and backward however the trace was recorded (``with_stack``
  adds the ``nn.Module:`` spans that would otherwise have made it forward);
* optimizer: ``Optimizer.step`` / ``zero_grad`` where neither of the above holds, and not the rest of a closure's
  call, which a ``with_stack`` trace's frames show (:mod:`~orchestrator.analysis.closures`): that is the loop's own.

Within the optimizer's own time, the ops it runs say how it updates the parameters (:func:`top_level_ops`,
:func:`optimizer_impl`), which decides its fix.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from orchestrator.analysis.closures import closure_calls
from orchestrator.analysis.intervals import Intervals, clip, cover, intersect, membership, subtract, union
from orchestrator.analysis.spans import (
    OPTIMIZER_STEP,
    Kinds,
    collective_of,
    is_backward,
    is_comm,
    is_forward,
    is_optimizer,
    where,
)
from orchestrator.models.analysis import BackwardPasses, OptimizerImpl
from orchestrator.traces.loader import Span

__all__ = ["Reductions", "backward_passes", "batch_fetch", "collated_ops", "nested_phases", "optimizer_impl", "top_level", "top_level_ops", "unmarked_forward"]

# ``step``: an Optimizer.step itself, in which a closure may run the model; ``optimizer``: zero_grad.
Label = Literal["forward", "backward", "optimizer", "step"]
# The collectives that reduce gradients: DDP's all-reduce, FSDP's reduce-scatter (an all-reduce on gloo).
_REDUCTIONS = frozenset({"all_reduce", "reduce_scatter"})


def _label(span: Span) -> Label | None:
    if is_optimizer(span):
        return "step" if span.name.startswith(OPTIMIZER_STEP) else "optimizer"
    if is_backward(span):
        return "backward"
    if is_forward(span):
        return "forward"
    return None


def innermost(spans: Iterable[tuple[float, float, Label]]) -> dict[Label, Intervals]:
    """Each label's time where its span is the innermost labelled one open (spans of one thread)."""
    ordered = sorted(spans, key=lambda s: (s[0], -s[1]))
    out: dict[Label, Intervals] = defaultdict(list)
    stack: list[tuple[float, Label]] = []  # (end, label) of the open spans, innermost last
    cur = float("-inf")
    i, n = 0, len(ordered)
    while i < n or stack:
        while stack and stack[-1][0] <= cur:
            stack.pop()
        nxt = ordered[i][0] if i < n else float("inf")
        if not stack:
            if i >= n:
                break
            cur = nxt
        else:
            t = min(stack[-1][0], nxt)
            if t > cur:
                out[stack[-1][1]].append((cur, t))
            cur = t
        while i < n and ordered[i][0] <= cur:
            if ordered[i][1] > cur:
                stack.append((ordered[i][1], ordered[i][2]))
            i += 1
    return {label: union(ivs) for label, ivs in out.items()}


def nested_phases(
    main: list[Span], main_kinds: Kinds, skip: frozenset[str], backward_elsewhere: Intervals, comm_elsewhere: Intervals,
    frames: Sequence[Span] = (),
) -> dict[Literal["forward", "backward", "optimizer"], Intervals]:
    """The main thread's forward, backward and optimizer intervals (disjoint).

    ``main``: its spans in start order; ``skip``: its step span names; ``backward_elsewhere``:
    when the process's autograd threads run backward; ``comm_elsewhere``: when its other threads run collectives.
    """
    labelled = _recomputed_as_backward([
        (s.ts, s.end, label)
        for group in main_kinds.values() if (label := _label(group[0])) is not None
        for s in group
    ])
    inner = innermost(labelled)
    step = inner.get("step", [])
    if not step:
        return {"forward": inner.get("forward", []), "backward": inner.get("backward", []), "optimizer": inner.get("optimizer", [])}
    # An Optimizer.step's own time in which the main thread runs no op while an autograd thread runs backward.
    steps = frozenset(name for (name, _), group in main_kinds.items() if _label(group[0]) == "step")
    deeper = cover(main, skip=skip | steps)
    idle = subtract(step, deeper)
    waiting = intersect(idle, backward_elsewhere)
    backward = union(inner.get("backward", []) + waiting)
    # ... or while another thread runs a collective (gloo's worker: the all-reduce that a closure's backward
    # started under DDP, which Lightning's optimizer step waits for): no optimizer time, it stays for rank's rule 8
    # to call communication.
    step = subtract(step, union(waiting + intersect(subtract(idle, waiting), comm_elsewhere)))
    # The closure's model and loss: an Optimizer.step's own time before the first backward inside it.
    any_backward = union(backward + backward_elsewhere)
    before: Intervals = []
    for t0, t1 in union((s[0], s[1]) for s in labelled if s[2] == "step"):
        first = next(iter(clip(any_backward, t0, t1)), None)
        if first is not None:
            before += clip(step, t0, first[0])
    forward = union(inner.get("forward", []) + before)
    # What a closure runs after its backward (its calls read from with_stack ``frames``) is the loop's own work:
    # neither the optimizer's nor a phase of the model's.
    calls = closure_calls(frames, union((s[0], s[1]) for s in labelled if s[2] == "step"))
    optimizer = union(subtract(subtract(step, before), calls) + inner.get("optimizer", []))
    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def _recomputed_as_backward(labelled: list[tuple[float, float, Label]]) -> list[tuple[float, float, Label]]:
    """``labelled`` with each forward span that starts inside a backward span labelled backward: a checkpointed
    module's forward run again by backward (spans of one thread nest, so a start inside is a span inside)."""
    in_backward = membership(union((t0, t1) for t0, t1, label in labelled if label == "backward"))
    return [(t0, t1, "backward" if label == "forward" and in_backward(t0) else label) for t0, t1, label in labelled]


def _no_op_between(op_starts: Sequence[float], a: float, b: float) -> bool:
    """Whether none of ``op_starts`` (sorted: the main thread's ops, or the optimizer's steps) is in ``[a, b)``."""
    return bisect.bisect_left(op_starts, a) == bisect.bisect_left(op_starts, b)


def backward_passes(backward: Intervals, op_starts: Sequence[float]) -> Intervals:
    """``backward`` (sorted) merged into passes: spans with no op of the main thread starting between them are one
    pass (the autograd engine's gaps between its nodes are backward's, not a forward's). ``op_starts``: the start
    of each op of the main thread, sorted."""
    passes: Intervals = []
    for b0, b1 in backward:
        if passes and _no_op_between(op_starts, passes[-1][1], b0):
            passes[-1] = (passes[-1][0], b1)
        else:
            passes.append((b0, b1))
    return passes


class Reductions:
    """Where a rank's gradient reductions start (on any thread: DDP and FSDP launch them from inside backward, on
    whichever thread runs it) and where its optimizer steps run: what a step's backward passes are counted against."""

    def __init__(self, threads: Iterable[Kinds], main: Kinds) -> None:
        self.starts = sorted(
            s.ts for kinds in threads for (name, _), group in kinds.items()
            if is_comm(group[0]) and collective_of(name) in _REDUCTIONS for s in group
        )
        steps = union(where(main, lambda s: s.name.startswith(OPTIMIZER_STEP)))
        self._in_step = membership(steps)
        self._step_starts = [t0 for t0, _ in steps]

    def of(self, passes: Intervals) -> BackwardPasses:
        """A step's backward ``passes`` (:func:`backward_passes`) and the reductions they start. A pass inside an
        optimizer step is a closure's (LBFGS evaluating the loss again), which needs its gradients whole: not
        counted. A reducing pass is early when the next reducing pass comes before any optimizer step: the gradients
        were all-reduced, then added to, and only the last sum is used."""
        outer = [(b0, b1) for b0, b1 in passes if not self._in_step(b0)]
        starts = self.starts
        reducing = [(b0, b1) for b0, b1 in outer if bisect.bisect_left(starts, b0) < bisect.bisect_right(starts, b1)]
        early = sum(_no_op_between(self._step_starts, a1, b0) for (_, a1), (b0, _) in zip(reducing, reducing[1:]))
        return BackwardPasses(passes=len(outer), reducing=len(reducing), early=early)


def batch_fetch(t0: float, t1: float, passes: Intervals, fetches: Intervals, op_starts: Sequence[float]) -> float | None:
    """When the step ``[t0, t1)`` (its backward ``passes``: :func:`backward_passes`) starts fetching the batch its
    first forward runs on: the first of the last run of fetches before its first pass (fetches with no op of the
    main thread between them are one run: a Trainer fetches all its micro-batches at once; an evaluation before
    them fetches, runs its model, fetches again), or the first fetch in a step without backward; None where it
    fetches none."""
    fetched = clip(fetches, t0, passes[0][0] if passes else t1)
    if not fetched:
        return None
    if not passes:
        return fetched[0][0]
    i = len(fetched) - 1
    while i > 0 and _no_op_between(op_starts, fetched[i - 1][1], fetched[i][0]):
        i -= 1
    return fetched[i][0]


def unmarked_forward(t0: float, t1: float, remaining: Intervals, passes: Intervals, fetches: Intervals) -> Intervals:
    """Where the model and its loss run in the step ``[t0, t1)`` without a marker: the step's ``remaining`` time
    before each backward pass (``passes``: :func:`backward_passes`), from the end of the last batch fetch
    (``fetches``: DataLoader next()) before it, or from the step's start (the first pass) or the previous pass's
    end (the next micro-batch) where no fetch lies between. Time before that fetch is the loop's between steps (a
    checkpoint save, an evaluation, logging), not a forward on a batch it has not fetched yet; time after the last
    pass is the step's tail (clipping, logging). A step with no backward (inference: a pipeline may run several
    batches a step) is the model's from its first fetch to its end."""
    if not passes:
        fetched = clip(fetches, t0, t1)
        return clip(remaining, fetched[0][1] if fetched else t0, t1)
    out: Intervals = []
    start = t0
    for b0, b1 in passes:
        fetched = clip(fetches, start, b0)
        out += clip(remaining, fetched[-1][1] if fetched else start, b0)
        start = b1
    return out


def top_level_ops(main: list[Span], intervals: Intervals) -> int:
    """How many ops of ``main`` (in start order) start in ``intervals`` inside no other such op: for the optimizer's
    own time, several per parameter for a per-parameter optimizer (Adam(foreach=False): 9), a few in all for a foreach
    or fused one. The Optimizer.step / zero_grad spans themselves are no op."""
    return sum(1 for _ in top_level(main, intervals))


def collated_ops(main: list[Span], intervals: Intervals) -> int:
    """:func:`top_level_ops` in ``intervals`` (DataLoader next()) where an ``aten::stack`` among them collates samples
    fetched one by one (default_collate stacks each field of them), else 0: a dataset that builds whole batches runs
    many ops a call too (PARAM's DLRM generator: 159, per embedding table) and concatenates."""
    ops = [s.name for s in top_level(main, intervals)]
    return len(ops) if "aten::stack" in ops else 0


def top_level(main: list[Span], intervals: Intervals) -> Iterator[Span]:
    """The ops of ``main`` (in start order) that start in ``intervals`` (sorted, apart) inside no other such op."""
    end, i = float("-inf"), 0
    for s in main:
        if s.cat != "cpu_op" or s.ts < end or is_optimizer(s):
            continue
        while i < len(intervals) and intervals[i][1] <= s.ts:
            i += 1
        if i < len(intervals) and intervals[i][0] <= s.ts:
            end = s.end
            yield s


# torch.optim's fused steps (fused=True); other aten::_fused_ ops (dropout, SDPA's choice) are no optimizer's.
_FUSED_STEPS = ("aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")


def optimizer_impl(main: Kinds, intervals: Intervals) -> OptimizerImpl | None:
    """How the optimizer steps in ``intervals`` (its own time) update the parameters, from the ops they run: torch's
    fused kernels (``aten::_fused_adam_``), its foreach ops (``aten::_foreach_mul_``), or neither (per parameter, or
    an optimizer of its own). None where no optimizer ran."""
    if not intervals:
        return None
    seen = {
        "fused" if name.startswith(_FUSED_STEPS) else "foreach"
        for (name, cat), group in main.items()
        if cat == "cpu_op" and name.startswith((*_FUSED_STEPS, "aten::_foreach_")) and any(clip(intervals, s.ts, s.end) for s in group)
    }
    return "fused" if "fused" in seen else "foreach" if "foreach" in seen else "per_parameter"
