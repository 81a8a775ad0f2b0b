"""The host threads of one rank's trace: which one runs the training loop, and each span's self time on a thread.

The loop's thread is the one with ``ProfilerStep#N`` spans (a Ray Train worker runs its loop off the process's main
thread), else the busiest with forward or optimizer spans; :func:`walk_thread` is the one pass over a thread's
spans that the phase split and the sync and copy rules share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from orchestrator.analysis.intervals import cover, total
from orchestrator.analysis.spans import Kinds, is_forward, is_optimizer
from orchestrator.layout import parse_profiler_step
from orchestrator.traces.loader import Span

__all__ = ["Thread", "main_thread", "walk_thread"]

Thread = tuple[object, object]


def walk_thread(
    spans: list[Span], on_span: Callable[[Span, list[Span]], None] | None, wanted: frozenset[str]
) -> list[float]:
    """Each span's self time, in the order of ``spans`` (one thread's, sorted by (start, -end)).

    ``on_span(span, open_ancestors)`` is called, in nesting order, for the spans
    named in ``wanted``. Children that spill past their parent by rounding still count as children.
    """
    self_us = [s.end - s.ts for s in spans]
    # The open spans' ends and indexes, as plain lists: this loop runs once per span of the rank.
    ends: list[float] = []
    at: list[int] = []
    stack: list[Span] = []  # the open spans themselves, kept only for on_span
    track = on_span is not None
    for i, span in enumerate(spans):
        ts = span.ts
        while ends and ends[-1] <= ts:
            ends.pop()
            at.pop()
            if track:
                stack.pop()
        end = span.end
        if ends:
            parent = ends[-1]
            self_us[at[-1]] -= (end if end < parent else parent) - ts  # min() without a call: once per span
        if track:
            if span.name in wanted:
                # Not an ancestor that ended under a spilled child: the agent's prof.step() runs inside the
                # optimizer step's annotation, so each ProfilerStep starts just before the previous
                # Optimizer.step ends, and that step would otherwise enclose the whole next step.
                on_span(span, [a for a in stack if a.end > ts])  # type: ignore[misc]
            stack.append(span)
        ends.append(end)
        at.append(i)
    return self_us


def main_thread(threads: dict[Thread, list[Span]], kinds: dict[Thread, Kinds]) -> tuple[Thread | None, list[Span]]:
    """The ProfilerStep thread, else the busiest with forward or optimizer spans (autograd's can be busier); its steps."""
    step_groups = {
        key: [group for (name, _), group in by_name.items() if parse_profiler_step(name) is not None]
        for key, by_name in kinds.items()
    }
    step_counts = Counter({key: sum(map(len, groups)) for key, groups in step_groups.items() if groups})
    if step_counts:
        key = step_counts.most_common(1)[0][0]
        return key, sorted((s for group in step_groups[key] for s in group), key=lambda s: s.ts)
    python = [k for k in threads if any(is_forward(g[0]) or is_optimizer(g[0]) for g in kinds[k].values())]
    busiest = max(python or threads, key=lambda k: total(cover(threads[k])), default=None)
    return busiest, []
