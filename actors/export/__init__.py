"""Turn an exported Chrome trace into a rank's artifacts, in a child process.

Run as ``python -m actors.export RAW OUT_DIR [--memory] [--shapes] [--max-bytes N]``. Parsing
a trace is pure Python; done in the training process it would hold the GIL
for hundreds of milliseconds and slow the steps after a window several-fold.
This module imports only the standard library so the child starts fast.

Writes into OUT_DIR: ``trace.json.gz``, ``ops.csv`` and, with ``--memory``,
``memory.json.gz``; prints ``{"steps": {N: ms}, "base_time_ns": ..., "raw_bytes": ...,
"cut": bool}`` on stdout. A trace over ``--max-bytes`` is cut to the leading
whole steps that fit (``"cut": true``); exit status 3 when not even one does.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import shutil
import sys
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.layout import parse_profiler_step

__all__ = ["EXIT_TOO_LARGE", "OP_COLUMNS", "memory_timeline", "op_table", "step_spans", "trim_to_cap"]

EXIT_TOO_LARGE = 3

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

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Operators and record_function ranges, as key_averages() counts them.
_HOST_CATEGORIES = ("cpu_op", "user_annotation")
# Parsing costs ~10x a trace's size in memory; far over the cap, refuse instead.
TRIM_LIMIT_FACTOR = 2


def step_spans(events: list[dict[str, Any]]) -> dict[int, float]:
    """``ProfilerStep#N`` -> duration in ms."""
    steps: dict[int, float] = {}
    for ev in events:
        if ev.get("ph") == "X" and (n := parse_profiler_step(ev.get("name", ""))) is not None:
            steps[n] = float(ev.get("dur", 0)) / 1000.0
    return steps


def memory_timeline(trace: dict[str, Any]) -> dict[str, Any]:
    """Allocated and reserved bytes over time per device, from ``[memory]`` events."""
    series: dict[str, dict[str, list[float]]] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("name") != "[memory]":
            continue
        args = ev.get("args", {})
        device = f"{'cuda' if args.get('Device Type') == 1 else 'cpu'}:{args.get('Device Id', -1)}"
        s = series.setdefault(device, {"ts_us": [], "allocated_bytes": [], "reserved_bytes": []})
        s["ts_us"].append(ev.get("ts", 0))
        s["allocated_bytes"].append(args.get("Total Allocated", 0))
        s["reserved_bytes"].append(args.get("Total Reserved", 0))
    return {
        "base_time_ns": trace.get("baseTimeNanoseconds"),
        "devices": {
            d: {**s, "peak_allocated_bytes": max(s["allocated_bytes"], default=0)} for d, s in sorted(series.items())
        },
    }


def op_table(events: list[dict[str, Any]], *, by_shape: bool) -> list[list[Any]]:
    """Per-operator totals like ``key_averages()``, computed from the trace.

    Self CPU time is an op's duration minus the ops nested in it on the same
    thread; device time is the kernels it launched (matched by ``External id``),
    self or including nested ops. Rows sorted by self CPU time, largest first.
    """
    device_by_op: dict[Any, float] = defaultdict(float)
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in _DEVICE_CATEGORIES:
            ext = ev.get("args", {}).get("External id")
            if ext is not None:
                device_by_op[ext] += float(ev.get("dur", 0))

    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in _HOST_CATEGORIES:
            by_thread[(ev.get("pid"), ev.get("tid"))].append(ev)

    rows: dict[tuple[str, str], list[float]] = {}

    def pop(stack: list[list[Any]]) -> None:
        ev, nested_cpu, nested_device = stack.pop()
        args = ev.get("args", {})
        dur = float(ev.get("dur", 0))
        self_device = device_by_op.get(args.get("External id"), 0.0)
        key = (ev.get("name", ""), json.dumps(args.get("Input Dims")) if by_shape else "")
        row = rows.setdefault(key, [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += dur
        row[2] += dur - nested_cpu
        row[3] += self_device + nested_device
        row[4] += self_device
        row[5] += float(args.get("flops", 0) or 0)
        if stack:
            stack[-1][1] += dur
            stack[-1][2] += self_device + nested_device

    for ops in by_thread.values():
        ops.sort(key=lambda e: (e.get("ts", 0), -e.get("dur", 0)))
        stack: list[list[Any]] = []  # [event, nested cpu time, nested device time]
        for ev in ops:
            start = ev.get("ts", 0)
            while stack and stack[-1][0].get("ts", 0) + stack[-1][0].get("dur", 0) <= start:
                pop(stack)
            stack.append([ev, 0.0, 0.0])
        while stack:
            pop(stack)

    table = [
        [name, shapes, int(r[0]), round(r[1], 3), round(r[2], 3), round(r[3], 3), round(r[4], 3), int(r[5])]
        for (name, shapes), r in rows.items()
    ]
    return sorted(table, key=lambda row: row[4], reverse=True)


def trim_to_cap(trace: dict[str, Any], max_bytes: int) -> dict[str, Any] | None:
    """``trace`` cut to the leading whole profiler steps that fit in ``max_bytes``.

    Host events belong to the step whose span they start in (events before
    the first step, to the first step); GPU work and its flow arrows belong
    to the step of the runtime call that launched it, even when the kernel
    ends after that step. Metadata is always kept. Sizes are of the compact
    JSON this function's caller writes. None when not even one step fits.
    """
    events = trace.get("traceEvents", [])
    spans = sorted(
        (ev["ts"], n)
        for ev in events
        if ev.get("ph") == "X" and "ts" in ev and (n := parse_profiler_step(ev.get("name", ""))) is not None
    )
    if not spans:
        return None
    starts = [ts for ts, _ in spans]

    def by_time(ev: dict[str, Any]) -> int:
        return max(0, bisect_right(starts, ev["ts"]) - 1)

    launched = {
        ev["args"]["correlation"]: by_time(ev)
        for ev in events
        if ev.get("cat") in _RUNTIME_CATEGORIES and "ts" in ev and "correlation" in ev.get("args", {})
    }
    sizes = [0] * len(spans)
    buckets: list[int | None] = []
    for ev in events:
        if ev.get("ph") == "M" or "ts" not in ev:
            buckets.append(None)
            continue
        if ev.get("cat") == "ac2g":
            bucket = launched.get(ev.get("id"), by_time(ev))
        elif ev.get("cat") in _DEVICE_CATEGORIES:
            bucket = launched.get(ev.get("args", {}).get("correlation"), by_time(ev))
        else:
            bucket = by_time(ev)
        buckets.append(bucket)
        sizes[bucket] += len(json.dumps(ev, separators=(",", ":"))) + 1
    total = len(json.dumps({k: v for k, v in trace.items() if k != "traceEvents"}, separators=(",", ":"))) + 16
    total += sum(len(json.dumps(ev, separators=(",", ":"))) + 1 for ev, b in zip(events, buckets) if b is None)
    keep = 0
    for size in sizes:
        if total + size > max_bytes:
            break
        total += size
        keep += 1
    if keep == 0:
        return None
    kept = [ev for ev, b in zip(events, buckets) if b is None or b < keep]
    return {**trace, "traceEvents": kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--shapes", action="store_true")
    parser.add_argument("--max-bytes", type=int, default=None)
    args = parser.parse_args(argv)

    raw_bytes = args.raw.stat().st_size
    cap = args.max_bytes
    if cap is not None and raw_bytes > TRIM_LIMIT_FACTOR * cap:
        print(f"trace is {raw_bytes} bytes, more than {TRIM_LIMIT_FACTOR}x the cap of {cap} bytes", file=sys.stderr)
        return EXIT_TOO_LARGE
    with open(args.raw, "rb") as f:
        trace = json.load(f)
    cut = cap is not None and raw_bytes > cap
    if cut:
        trimmed = trim_to_cap(trace, cap)
        if trimmed is None:
            print(
                f"trace is {raw_bytes} bytes and its first step alone is over the cap of {cap} bytes", file=sys.stderr
            )
            return EXIT_TOO_LARGE
        trace = trimmed
        with open(args.raw, "w", encoding="utf-8") as f:
            json.dump(trace, f, separators=(",", ":"))
    events = trace.get("traceEvents", [])
    # Level 6 is within a few percent of 9 on traces at a third of the CPU.
    with open(args.raw, "rb") as fin, gzip.open(args.out / "trace.json.gz", "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)
    if args.memory:
        with gzip.open(args.out / "memory.json.gz", "wt", encoding="utf-8") as f:
            json.dump(memory_timeline(trace), f)
    with open(args.out / "ops.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(OP_COLUMNS)
        writer.writerows(op_table(events, by_shape=args.shapes))
    result = {
        "steps": step_spans(events),
        "base_time_ns": trace.get("baseTimeNanoseconds"),
        "raw_bytes": raw_bytes,
        "cut": cut,
    }
    json.dump(result, sys.stdout)
    return 0

