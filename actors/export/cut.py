"""Cut a trace over the byte cap to its leading whole profiler steps, in two streaming passes.

Pass one (:func:`plan_cut`) notes for every event only what places it in a
step: its kind, time, correlation id and size (25 bytes an event), plus the
step starts and the runtime calls' times. Host events belong to the step
whose span they start in (events before the first step, to the first step);
GPU work and its flow arrows belong to the step of the runtime call that
launched it, even when the kernel ends after that step. Metadata and events
without a time are always kept. The plan is one byte per event: keep or drop.

Pass two (:func:`write_kept`) writes the top-level fields, then the kept
events as their original text, so the sizes counted in pass one are exactly
the bytes written and the result never exceeds the cap.

Standard library only: the export child imports it and must start fast.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from actors.export.reader import EVENTS_KEY, Event
from actors.export.tables import DEVICE_CATEGORIES, number
from orchestrator.layout import parse_profiler_step
from orchestrator.traces.categories import RUNTIME_CATEGORIES

__all__ = ["EVENT_SEPARATOR", "Cut", "plan_cut", "trace_head", "write_kept"]

EVENT_SEPARATOR = ",\n"
_TAIL = "\n]}\n"
_FLOW_CATEGORIES = ("ac2g", "async_cpu_to_gpu")
# What places an event in a step.
_ALWAYS, _BY_TIME, _BY_FLOW_ID, _BY_CORRELATION = 0, 1, 2, 3


@dataclass(frozen=True)
class Cut:
    """Which events to keep: ``keep[i]`` for the i-th event; ``steps`` whole steps fit."""

    keep: bytearray
    steps: int
    bytes: int


def trace_head(header: dict[str, Any]) -> str:
    """The text before the first event: every top-level field, then the opening of the event array."""
    fields = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in header.items())
    return f"{{{fields}{json.dumps(EVENTS_KEY)}: [\n"


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def plan_cut(events: Iterator[Event], header: dict[str, Any], max_bytes: int) -> Cut | None:
    """The leading whole steps of ``events`` that fit in ``max_bytes``; ``None`` when not even one does.

    ``header`` must be complete once ``events`` is exhausted (see TraceReader).
    """
    kinds, times, ids, sizes = array("b"), array("d"), array("q"), array("q")
    starts: list[tuple[float, int]] = []
    launched: dict[int, float] = {}
    for ev, size, _ in events:
        kind, ts, ident = _place(ev)
        kinds.append(kind)
        times.append(ts)
        ids.append(ident)
        sizes.append(size + len(EVENT_SEPARATOR))
        if kind == _ALWAYS:
            continue
        name = ev.get("name")
        if ev.get("ph") == "X" and isinstance(name, str) and (n := parse_profiler_step(name)) is not None:
            starts.append((ts, n))
        elif ev.get("cat") in RUNTIME_CATEGORIES and (corr := _id(_args(ev).get("correlation"))) is not None:
            launched[corr] = ts
    if not starts:
        return None
    starts.sort()
    step_starts = [ts for ts, _ in starts]

    def step_at(ts: float) -> int:
        return max(0, bisect_right(step_starts, ts) - 1)

    def step_of(i: int) -> int:
        kind = kinds[i]
        if kind == _BY_TIME:
            return step_at(times[i])
        launch = launched.get(ids[i])
        return step_at(launch if launch is not None else times[i])

    total = _utf8_len(trace_head(header)) + len(_TAIL)
    per_step = [0] * len(starts)
    for i in range(len(kinds)):
        if kinds[i] == _ALWAYS:
            total += sizes[i]
        else:
            per_step[step_of(i)] += sizes[i]
    keep_steps = 0
    for size in per_step:
        if total + size > max_bytes:
            break
        total += size
        keep_steps += 1
    if keep_steps == 0:
        return None
    keep = bytearray(kinds[i] == _ALWAYS or step_of(i) < keep_steps for i in range(len(kinds)))
    return Cut(keep=keep, steps=keep_steps, bytes=total)


def write_kept(out: IO[str], events: Iterator[Event], cut: Cut, header: dict[str, Any]) -> Iterator[Any]:
    """Write the trace ``cut`` keeps (events read with their text); yields each kept event's value."""
    out.write(trace_head(header))
    first = True
    count = 0
    for i, (ev, _, text) in enumerate(events):
        if i >= len(cut.keep):
            raise ValueError("the trace changed between the two passes: it has more events now")
        count += 1
        if cut.keep[i]:
            out.write(text if first else EVENT_SEPARATOR + text)
            first = False
            yield ev
    if count != len(cut.keep):
        raise ValueError("the trace changed between the two passes: it has fewer events now")
    out.write(_TAIL)


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


def _id(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def _place(ev: Any) -> tuple[int, float, int]:
    """(kind, time, correlation or flow id) of one event."""
    if not isinstance(ev, dict) or ev.get("ph") == "M":
        return _ALWAYS, 0.0, 0
    ts = ev.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return _ALWAYS, 0.0, 0
    category = ev.get("cat")
    if category in _FLOW_CATEGORIES and (ident := _id(ev.get("id"))) is not None:
        return _BY_FLOW_ID, number(ts), ident
    if category in DEVICE_CATEGORIES and (corr := _id(_args(ev).get("correlation"))) is not None:
        return _BY_CORRELATION, number(ts), corr
    return _BY_TIME, number(ts), 0
