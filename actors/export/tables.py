"""What the export child computes from a trace, one event at a time.

Each accumulator takes events through ``add`` and keeps numbers in typed
arrays, never the events: memory grows with the number of operators and
memory samples (a few dozen bytes each), not with the trace's text.

Standard library only: the export child imports it and must start fast.
"""

from __future__ import annotations

import json
import math
from array import array
from collections import defaultdict
from typing import IO, Any

from orchestrator.layout import parse_profiler_step
from orchestrator.traces.categories import device_label

__all__ = ["DEVICE_CATEGORIES", "OP_COLUMNS", "MemoryTimeline", "OpTable", "StepSpans", "number"]

OP_COLUMNS = [
    "name",
    "input_shapes",
    "count",
    "cpu_time_total_us",
    "self_cpu_time_total_us",
    "device_time_total_us",
    "self_device_time_total_us",
    "flops",
]

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Operators and record_function ranges, as key_averages() counts them.
_HOST_CATEGORIES = ("cpu_op", "user_annotation")
# An External id that is not an integer links nothing.
_NO_ID = -(2**63)


def number(value: Any) -> float:
    """``value`` as a finite float; 0.0 for anything else (strings, NaN, booleans, huge integers)."""
    # type() rather than isinstance: bool is an int, and this runs several times an event.
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else 0.0
    if kind is int:
        return float(value) if -(2**63) < value < 2**63 else 0.0
    return 0.0


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


def _int_id(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63:
        return value
    return _NO_ID


class StepSpans:
    """``ProfilerStep#N`` -> duration in ms."""

    def __init__(self) -> None:
        self.steps: dict[int, float] = {}

    def add(self, ev: dict[str, Any]) -> None:
        name = ev.get("name")
        if ev.get("ph") == "X" and isinstance(name, str) and (n := parse_profiler_step(name)) is not None:
            self.steps[n] = number(ev.get("dur", 0)) / 1000.0


class MemoryTimeline:
    """Allocated and reserved bytes over time per device, from ``[memory]`` events."""

    def __init__(self) -> None:
        self._series: dict[str, tuple[array, array, array]] = {}

    def add(self, ev: dict[str, Any]) -> None:
        if ev.get("name") != "[memory]":
            return
        args = _args(ev)
        device = device_label(args.get("Device Type"), _device_id(args.get("Device Id", -1)))
        series = self._series.get(device)
        if series is None:
            series = self._series[device] = (array("d"), array("d"), array("d"))
        series[0].append(number(ev.get("ts", 0)))
        series[1].append(number(args.get("Total Allocated", 0)))
        series[2].append(number(args.get("Total Reserved", 0)))

    def write(self, out: IO[str], base_time_ns: Any) -> None:
        """``{"base_time_ns", "devices": {device: {ts_us, allocated_bytes, reserved_bytes, peak_allocated_bytes}}}``."""
        out.write(f'{{"base_time_ns": {json.dumps(base_time_ns if _plain(base_time_ns) else None)}, "devices": {{')
        for i, (device, (ts, allocated, reserved)) in enumerate(sorted(self._series.items())):
            out.write(f'{", " if i else ""}{json.dumps(device)}: {{')
            for name, values in (("ts_us", ts), ("allocated_bytes", allocated), ("reserved_bytes", reserved)):
                out.write(f'"{name}": [')
                for start in range(0, len(values), 8192):
                    part = ", ".join(_text(v) for v in values[start : start + 8192])
                    out.write(f", {part}" if start else part)
                out.write("], ")
            out.write(f'"peak_allocated_bytes": {_text(max(allocated, default=0.0))}}}')
        out.write("}}")


def _device_id(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31 else -1


def _plain(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _text(value: float) -> str:
    # Integral values print as integers, as the trace wrote them.
    return str(int(value)) if value.is_integer() else repr(value)


class OpTable:
    """Per-operator totals like ``key_averages()``, computed from the trace.

    Self CPU time is an op's duration minus the ops nested in it on the same
    thread; device time is the kernels it launched (matched by ``External id``),
    self or including nested ops. Rows sorted by self CPU time, largest first.
    """

    def __init__(self, *, by_shape: bool) -> None:
        self._by_shape = by_shape
        # (name, repr of the shapes) -> row; repr is several times cheaper than json.dumps
        # and as distinct, so each row's shapes become JSON once, in rows().
        self._keys: dict[tuple[str, str], int] = {}
        self._shapes: list[Any] = []
        # (pid, tid) -> ts, dur, flops (doubles); key index, External id (int64)
        self._threads: dict[tuple[Any, Any], tuple[array, array, array, array, array]] = {}
        self._device_by_op: dict[int, float] = defaultdict(float)

    def add(self, ev: dict[str, Any]) -> None:
        if ev.get("ph") != "X":
            return
        category = ev.get("cat")
        if category in DEVICE_CATEGORIES:
            ext = _int_id(_args(ev).get("External id"))
            if ext != _NO_ID:
                self._device_by_op[ext] += number(ev.get("dur", 0))
        elif category in _HOST_CATEGORIES:
            args = _args(ev)
            name = ev.get("name", "")
            dims = args.get("Input Dims") if self._by_shape else None
            key = (name if type(name) is str else repr(name), repr(dims) if self._by_shape else "")
            index = self._keys.get(key)
            if index is None:
                index = self._keys[key] = len(self._keys)
                self._shapes.append(dims)
            thread = (_hashable(ev.get("pid")), _hashable(ev.get("tid")))
            ops = self._threads.get(thread)
            if ops is None:
                ops = self._threads[thread] = (array("d"), array("d"), array("d"), array("q"), array("q"))
            ops[0].append(number(ev.get("ts", 0)))
            ops[1].append(number(ev.get("dur", 0)))
            ops[2].append(number(args.get("flops", 0)))
            ops[3].append(index)
            ops[4].append(_int_id(args.get("External id")))

    def rows(self) -> list[list[Any]]:
        totals = [[0, 0.0, 0.0, 0.0, 0.0, 0.0] for _ in self._keys]
        for ts, dur, flops, keys, exts in self._threads.values():
            self._nest(totals, ts, dur, flops, keys, exts)
        names = [name for name, _ in self._keys]
        shapes = [json.dumps(dims) if self._by_shape else "" for dims in self._shapes]
        table = [
            [names[i], shapes[i], int(r[0]), round(r[1], 3), round(r[2], 3), round(r[3], 3), round(r[4], 3), int(r[5])]
            for i, r in enumerate(totals)
            if r[0]
        ]
        return sorted(table, key=lambda row: row[4], reverse=True)

    def _nest(self, totals: list[list[Any]], ts: array, dur: array, flops: array, keys: array, exts: array) -> None:
        device = self._device_by_op
        stack: list[list[Any]] = []  # [op index, nested cpu time, nested device time]

        def pop() -> None:
            i, nested_cpu, nested_device = stack.pop()
            self_device = device.get(exts[i], 0.0) if exts[i] != _NO_ID else 0.0
            row = totals[keys[i]]
            row[0] += 1
            row[1] += dur[i]
            row[2] += dur[i] - nested_cpu
            row[3] += self_device + nested_device
            row[4] += self_device
            row[5] += flops[i]
            if stack:
                stack[-1][1] += dur[i]
                stack[-1][2] += self_device + nested_device

        for i in _start_order(ts, dur):
            while stack and ts[stack[-1][0]] + dur[stack[-1][0]] <= ts[i]:
                pop()
            stack.append([i, 0.0, 0.0])
        while stack:
            pop()


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | None) else json.dumps(value)


def _start_order(ts: array, dur: array) -> range | list[int]:
    """Op indices by start time, the longer first on a tie (the enclosing op).

    Traces list a thread's ops in that order already; only otherwise is an
    index list sorted, for that thread only. Two stable sorts on one float each
    (duration descending, then start) give the same order as one sort on a
    (start, -duration) tuple at under half its peak memory (~70 bytes per op).
    """
    n = len(ts)
    if all(ts[i - 1] < ts[i] or (ts[i - 1] == ts[i] and dur[i - 1] >= dur[i]) for i in range(1, n)):
        return range(n)
    order = sorted(range(n), key=dur.__getitem__, reverse=True)
    order.sort(key=ts.__getitem__)
    return order
