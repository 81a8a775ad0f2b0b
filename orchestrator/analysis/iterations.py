"""The analysed windows of a trace: its ``ProfilerStep`` spans where it has them, else (the profiler ran without a
schedule) the device's active span or the iterations found in it.

A step is analysed only where the profiler recorded (its own ``PyTorch Profiler (N)`` span): a trace captured on
demand stops recording mid-step and Kineto still writes the open step to its end, seconds later (HTA's Triton
example: a 13.3 s step of which 1.7 ms was recorded), and the unrecorded rest would read as the host running
untraced Python while the device idles.

Without ``ProfilerStep`` spans, the window is the device's active span (first device event to last): before
and after it the host sets up and tears down, which no step pays for. It is
cut into iterations where the main thread's top-level spans repeat: a span
name that recurs at least :data:`MIN_REPEATS` times with the same sequence of
top-level names between its occurrences (in :data:`MIN_AGREEMENT` of them)
marks where each iteration starts. A ``record_function`` that covers most of
the window (one around the whole run) is looked into, so its children are
the top level. Among several such names the longest period wins (the
iteration, not a layer repeated inside it). Names of the same period mark the
same iterations at different phases; the iteration starts at a DataLoader
``next()``, else at the first of them after the optimizer step (a read of the
step's loss aside: ``prof.step()`` goes after ``optimizer.step()``), else at the
earliest. A pattern that covers less than :data:`MIN_COVER` of the active span
is one inside a part of the run (a layer's ops), not its iterations, unless its
period holds a DataLoader ``next()`` or an optimizer step: those are whole
training iterations, however long the warm-up before them (ResNet-50 under the
autograd profiler: 6 iterations after a 3.1 s first forward, 41% of the span).
Without iterations the active span is one window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from orchestrator.analysis.spans import OPTIMIZER_STEP, is_data, is_sync
from orchestrator.layout import parse_profiler_step
from orchestrator.traces.loader import Span

__all__ = [
    "MIN_AGREEMENT", "MIN_COVER", "MIN_REPEATS", "WindowKind", "device_window", "find_iterations", "recorded_steps",
    "unscheduled_windows",
]

MIN_REPEATS = 3
MIN_AGREEMENT = 0.75
# Iterations must cover this share of the device's active span.
MIN_COVER = 0.5
# A top-level span covering this share of the window is a wrapper: its children are the top level.
_WRAPPER_SHARE = 0.5
_MAX_DEPTH = 8
# A step that lasts this much longer than the profiler recorded of it is said to be cut (rounding aside).
_CUT_US = 1.0
_CATEGORIES = frozenset({"cpu_op", "user_annotation"})

Window = tuple[float, float]
WindowKind = Literal["iterations", "device_span", "whole_trace"]


def device_window(device_spans: Sequence[Span]) -> Window | None:
    """First device event's start to the last one's end."""
    if not device_spans:
        return None
    return min(s.ts for s in device_spans), max(s.end for s in device_spans)


def _top_level(spans: Sequence[Span]) -> list[Span]:
    """Spans (sorted by (start, -end)) that no earlier one contains."""
    out: list[Span] = []
    end = float("-inf")
    for s in spans:
        if s.ts >= end:
            out.append(s)
            end = s.end
    return out


def find_iterations(main: Sequence[Span], window: Window) -> tuple[list[Window], str]:
    """Iterations inside ``window`` from the main thread's spans (sorted by (start, -end)), and the span name that
    starts each; ([], "") without a repeating pattern."""
    t0, t1 = window
    spans = [s for s in main if s.cat in _CATEGORIES and s.end > t0 and s.ts < t1]
    top = _top_level(spans)
    for _ in range(_MAX_DEPTH):
        wrapper = next(
            (s for s in top if s.cat == "user_annotation" and min(s.end, t1) - max(s.ts, t0) >= _WRAPPER_SHARE * (t1 - t0)), None
        )
        if wrapper is None:
            break
        inside = _top_level([s for s in spans if s is not wrapper and wrapper.ts <= s.ts and s.end <= wrapper.end])
        if not inside:
            break
        at = top.index(wrapper)
        top = top[:at] + inside + top[at + 1 :]
    names = [s.name for s in top]
    cycle = _longest_cycle(names)
    if not cycle:
        return [], ""
    period = next(iter(cycle.values()))[1]
    marker = max(cycle, key=lambda name: (is_data(top[cycle[name][0][0]]), _follows_step(top, cycle, name, period), -cycle[name][0][0]))
    at = cycle[marker][0]
    starts = [top[i].ts for i in at]
    bounds = list(zip(starts, starts[1:]))
    if len(top) - at[-1] >= period / 2:  # a marker late in the period leaves the last iteration a stub
        bounds.append((starts[-1], max(s.end for s in top[at[-1] : at[-1] + period])))
    windows = [(max(a, t0), min(b, t1)) for a, b in bounds if min(b, t1) > max(a, t0)]
    whole = any(is_data(s) or s.name.startswith(OPTIMIZER_STEP) for s in top[at[0] : at[0] + period])
    if not whole and sum(b - a for a, b in windows) < MIN_COVER * (t1 - t0):
        return [], ""  # a pattern inside one part of the run (a layer's ops), not the run's iterations
    return windows, marker


def _longest_cycle(names: Sequence[str]) -> dict[str, tuple[list[int], int]]:
    """The names that repeat with the longest agreeing period: each name's positions and the period's length."""
    found: dict[str, tuple[list[int], int]] = {}
    for name, count in Counter(names).items():
        if count < MIN_REPEATS:
            continue
        at = [i for i, n in enumerate(names) if n == name]
        periods = Counter(tuple(names[a:b]) for a, b in zip(at, at[1:]))
        period, agreeing = periods.most_common(1)[0]
        if agreeing >= MIN_AGREEMENT * (len(at) - 1):
            found[name] = (at, len(period))
    longest = max((p for _, p in found.values()), default=0)
    return {name: entry for name, entry in found.items() if entry[1] == longest}


def _follows_step(top: Sequence[Span], cycle: dict[str, tuple[list[int], int]], name: str, period: int) -> bool:
    """Whether ``name`` is the first of the cycle's names after an optimizer step (reads of its loss aside)."""
    at = cycle[name][0]
    if is_sync(top[at[0]]):
        return False
    j = (at[1] if len(at) > 1 and at[0] == 0 else at[0]) - 1
    stop = max(j - period, -1)
    while j > stop and not top[j].name.startswith(OPTIMIZER_STEP) and (top[j].name not in cycle or is_sync(top[j])):
        j -= 1
    return j > stop and top[j].name.startswith(OPTIMIZER_STEP)


def unscheduled_windows(main: Sequence[Span], device_spans: Sequence[Span]) -> tuple[list[Window], WindowKind, str]:
    """The windows of a trace without ProfilerStep spans, which kind they are, and the issue that says so."""
    lead = "no ProfilerStep#N spans (the profiler ran without a schedule): "
    active = device_window(device_spans)
    if active is None:
        whole = (min(s.ts for s in main), max(s.end for s in main))
        return [whole], "whole_trace", lead + f"the whole trace, {(whole[1] - whole[0]) / 1000:.1f} ms of its main thread, is analysed as one window"
    span_ms = (active[1] - active[0]) / 1000
    windows, marker = find_iterations(main, active)
    if windows:
        return windows, "iterations", (
            lead + f"the device's active span ({span_ms:.1f} ms) is cut into {len(windows)} iterations, each starting at "
            f"the main thread's {marker[:80]!r}; idle time outside them is not counted"
        )
    return [active], "device_span", (
        lead + f"no repeating iteration found, so the device's active span, {span_ms:.1f} ms, is analysed as one window; "
        "no saving is claimed from it (its idle time may be one-off work: initialisation, warm-up)"
    )


def recorded_steps(steps: Sequence[Span], recorded: Window | None) -> tuple[list[Window], list[int], str | None]:
    """The ProfilerStep spans' windows and step numbers, each cut to ``recorded`` (when the profiler recorded; None:
    not known, nothing cut), and an issue where a step ran past it: a step with nothing recorded is left out. A
    recording that holds no step at all is no clock of these steps (a damaged or foreign span): nothing is cut."""
    if recorded is not None and not any(min(s.end, recorded[1]) > max(s.ts, recorded[0]) for s in steps):
        recorded = None
    windows: list[Window] = []
    numbers: list[int] = []
    cut: list[str] = []
    for s in steps:
        t0, t1 = (s.ts, s.end) if recorded is None else (max(s.ts, recorded[0]), min(s.end, recorded[1]))
        number = parse_profiler_step(s.name) or 0
        if (s.end - s.ts) - (t1 - t0) >= _CUT_US:
            kept = f"{(t1 - t0) / 1000:.1f} ms recorded" if t1 > t0 else "nothing recorded: left out"
            cut.append(f"step {number} has {(s.end - s.ts - max(t1 - t0, 0.0)) / 1000:.1f} ms outside the recording ({kept})")
        if t1 > t0:
            windows.append((t0, t1))
            numbers.append(number)
    issue = (
        "the profiler recorded only part of a step (on-demand tracing starts and stops mid-step), and only that part "
        "is analysed: "
        + "; ".join(cut[:3]) + (f"; {len(cut) - 3} more" if len(cut) > 3 else "")
    ) if cut else None
    return windows, numbers, issue
