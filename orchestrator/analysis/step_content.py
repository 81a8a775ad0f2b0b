"""What one step holds, counted in the trace: the optimizer steps by class and the model's forward passes.

The agent says what it counted as one step (``1 step = SGD.step ×1 + Adam.step ×1``, learned from the
optimizers' cycle); the trace says what each profiled step actually ran, on any trace, the agent's or
another tool's. A GAN step runs two optimizers and several forward passes (the generator once, the
discriminator on real and fake batches); a step with gradient accumulation runs one optimizer step and
several forward passes. Saying so is what makes a step time readable.

Counted on the main thread, per analysed window, and stated as the most common count (a step that
differs, such as the first one that builds the optimizer's state, does not change what a step is):

* optimizer steps: the outermost ``Optimizer.step#<Class>.step`` spans torch's profiler hook records;
* forward passes: the outermost forward spans (:func:`spans.is_forward`: ``nn.Module:`` spans,
  ``*.forward`` annotations such as DDP's, ``## forward ##``) by module, leaving out loss modules
  (``*Loss``): a loss's forward is part of the step, not a pass of the model; MMEngine's data preprocessors
  (:func:`~orchestrator.forward_passes.not_a_pass`); and those that begin in
  backward: activation checkpointing runs a checkpointed block's forward again there (on a CPU on the main
  thread), which is no pass of the model over a batch. A trace without any forward marker says nothing about
  forward passes.

The agent counts forward passes too (:mod:`actors.agent.forward_count`), worded alike
(:mod:`orchestrator.forward_passes`): :func:`one_step` compares the counts, not the modules' names.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable

from orchestrator.analysis.intervals import Intervals, clip, membership
from orchestrator.analysis.spans import OPTIMIZER_STEP, Kinds, is_forward
from orchestrator.forward_passes import UNNAMED, not_a_pass, phrase, stated, typical
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Manifest
from orchestrator.traces.loader import Span

__all__ = ["describe_step", "loader_class", "one_step", "optimizer_classes"]

_ONE_STEP = "1 step = "


def _module(span: Span) -> str:
    name = span.name
    if name.startswith("nn.Module:"):
        # Kept as named (``Sequential_1``): the suffix tells two instances of one class apart.
        return name.removeprefix("nn.Module:").strip()
    if name.endswith(".forward"):
        return name.removesuffix(".forward")
    return UNNAMED


def _outermost(spans: Iterable[Span]) -> list[Span]:
    """The spans not inside another of them."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.ts, -s.end)):
        if not out or span.ts >= out[-1].end:
            out.append(span)
    return out


def _per_window(spans: list[Span], windows: list[tuple[float, float]], key: Callable[[Span], str]) -> list[Counter[str]]:
    """Each window's count of ``spans`` by ``key`` (a span belongs to the window it starts in)."""
    starts = [t0 for t0, _ in windows]
    out: list[Counter[str]] = [Counter() for _ in windows]
    for span in spans:
        i = bisect.bisect_right(starts, span.ts) - 1
        if i >= 0 and span.ts < windows[i][1]:
            out[i][key(span)] += 1
    return out


def _optimizers(steps: list[Span], counts: list[Counter[str]], backward: list[bool]) -> str:
    """``SGD.step ×1 + Adam.step ×1``: the typical count, classes in the order they first step (as the agent
    states its cycle). Where over a third of three or more steps hold no optimizer step, said with how many steps
    hold one, counted over those, and what the others are by whether they run backward (``backward``, per step):
    micro-batches of gradient accumulation (a loop that calls prof.step() per micro-batch), or evaluation."""
    stepped = [c for c in counts if c]
    partial = len(counts) >= 3 and 3 * (len(counts) - len(stepped)) > len(counts) and bool(stepped)
    most = typical(stepped if partial else counts)
    order = dict.fromkeys(name for s in steps if (name := s.name.removeprefix(OPTIMIZER_STEP)) in most)
    listed = " + ".join(f"{name} ×{most[name]}" for name in order)
    if not partial:
        return listed
    others = [b for c, b in zip(counts, backward) if not c]
    if all(others):
        return f"part of an iteration ({listed} in {len(stepped)} of {len(counts)} steps: a step per micro-batch of gradient accumulation)"
    if not any(others):
        return f"{listed} in {len(stepped)} of {len(counts)} steps (the other {len(others)} run no backward: evaluation batches)"
    return f"{listed} in {len(stepped)} of {len(counts)} steps"


def _terms(definition: str) -> list[str]:
    """A statement's optimizer part as sorted terms, outside and inside apart: the agent lists optimizers
    in the order their steps end, a trace in the order they start."""
    outer, _, inner = definition.split(";")[0].removesuffix(")").partition(" (inside: ")
    return sorted(outer.split(" + ")) + ["inside:"] + sorted(inner.split(" + ") if inner else [])


def _passes_differ(agent: str, traced: str) -> bool:
    """Both count forward passes and the counts differ. Modules stay out: the agent names classes (``Net``),
    the trace instances (``Net_0``, ``Sequential_1``)."""
    counted, seen = stated(agent), stated(traced)
    return counted is not None and seen is not None and counted != seen


def describe_step(kinds: Kinds, windows: list[tuple[float, float]], backward: Intervals) -> str | None:
    """``1 step = SGD.step ×1 + Adam.step ×1; 4 forward passes (Discriminator ×3, Generator ×1)`` from the
    main thread's spans grouped by kind, or None when the windows hold neither an optimizer step nor a
    forward marker. ``windows`` are sorted and do not overlap; ``backward``: backward's time on any thread."""
    # A wrapping optimizer (TorchRec's CombinedOptimizer) steps the ones it holds inside its own step: they
    # are what runs inside it, as the agent says of them.
    every = [s for (name, _), group in kinds.items() if name.startswith(OPTIMIZER_STEP) for s in group]
    steps = _outermost(every)
    outer_ids = {id(s) for s in steps}
    inner = sorted((s for s in every if id(s) not in outer_ids), key=lambda s: s.ts)
    forwards = _outermost(s for group in kinds.values() if is_forward(group[0]) for s in group)
    in_backward = membership(backward)
    models = [s for s in forwards if not not_a_pass(_module(s)) and not in_backward(s.ts)]
    optimizer_counts = _per_window(steps, windows, lambda s: s.name.removeprefix(OPTIMIZER_STEP))
    model_counts = _per_window(models, windows, _module)
    if not any(optimizer_counts) and not any(model_counts):
        return None
    backward_in = [bool(clip(backward, t0, t1)) for t0, t1 in windows]
    parts = [_optimizers(steps, optimizer_counts, backward_in) or "no optimizer step"]
    if inner:
        held = _optimizers(inner, _per_window(inner, windows, lambda s: s.name.removeprefix(OPTIMIZER_STEP)), backward_in)
        parts[0] += f" (inside: {held})" if held else ""
    if any(model_counts):
        parts.append(phrase(typical(model_counts)))
    return _ONE_STEP + "; ".join(parts)


def optimizer_classes(kinds: Kinds, windows: list[tuple[float, float]]) -> list[str]:
    """The optimizer classes stepped in ``windows`` (``Adam`` of ``Optimizer.step#Adam.step``), wrapped ones included
    (TorchRec's ``CombinedOptimizer`` steps an ``Adam``), in the order of their first step: what the optimizer's
    fix is chosen by."""
    steps = sorted((s for (name, _), group in kinds.items() if name.startswith(OPTIMIZER_STEP) for s in group), key=lambda s: s.ts)
    inside = (s for s in steps if any(t0 <= s.ts < t1 for t0, t1 in windows))
    return list(dict.fromkeys(s.name.removeprefix(OPTIMIZER_STEP).removesuffix(".step") for s in inside))


def one_step(summary: Summary, manifest: Manifest | None = None) -> str | None:
    """The sentence a report, the CLI and the MCP answer say of what one step is: what the agent counted
    (the manifest's ranks), what the trace's steps hold, or both when they say different things; and whose
    loop runs the steps, where a framework's does."""
    said = _one_step(summary, manifest)
    if summary.loop is not None:
        # Whose loop it is, even where nothing says what a step holds (a trace of a loop that steps no torch
        # optimizer and records no forward marker: fastai's Learner, Keras's fit()).
        return f"{said + ' ' if said else ''}Training loop: {summary.loop.label}."
    return said


def _one_step(summary: Summary, manifest: Manifest | None) -> str | None:
    counted = sorted({r.step_definition for r in manifest.ranks if r.step_definition}) if manifest else []
    agent = counted[0].removeprefix(_ONE_STEP) if len(counted) == 1 else None
    traced = summary.step_definition.removeprefix(_ONE_STEP) if summary.step_definition else None
    if agent and traced and (_terms(traced) != _terms(agent) or _passes_differ(agent, traced)):
        return f"One step (as the agent counted it): {agent}; in the trace each step holds {traced}."
    if agent and traced and stated(traced) is None and stated(agent) is not None:
        # A trace without forward markers (no Python stacks recorded) agrees on what it shows.
        return f"One step (as the agent counted it, the trace showing the same optimizer steps): {agent}."
    if traced:
        # Agreeing, the agent's words name the model by its class (PeftModel, Generator ×1) where the trace names
        # instances and wrappers (Sequential_1, DistributedDataParallel_0).
        shown = agent if agent and stated(agent) is not None else traced
        return f"One step ({'as the agent counted it and ' if agent else 'as '}the trace shows): {shown}."
    if agent:
        return f"One step (as the agent counted it): {agent}."
    return None


def loader_class(main: Kinds) -> str | None:
    """The DataLoader iterator class the main thread's first ``enumerate(DataLoader)#...`` span names, if any."""
    first = min(
        (group[0] for (name, _), group in main.items() if name.startswith("enumerate(DataLoader)#")),
        key=lambda s: (s.ts, -s.end), default=None,
    )
    return first.name.split("#", 1)[1].split(".")[0] if first is not None else None
