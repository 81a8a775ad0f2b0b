"""Turn an exported Chrome trace into a rank's artifacts, in a child process.

Run as ``python -m actors.export RAW OUT_DIR [--memory] [--shapes] [--max-bytes N]``
(the command line, file names, exit codes and result: :mod:`actors.export.contract`). Parsing
a trace is pure Python; done in the training process it would hold the GIL
for hundreds of milliseconds and slow the steps after a window several-fold.
This module imports only the standard library and its own package so the
child starts fast.

The trace is streamed (:mod:`actors.export.reader`), never loaded whole: the
child's memory is bounded by the largest single event plus a few dozen bytes
per operator, memory sample and (when cutting) event, not by the trace's size.

Writes into OUT_DIR: ``trace.json.gz``, ``ops.csv`` and, with ``--memory``,
``memory.json.gz``; prints an :class:`~actors.export.contract.ExportResult` as JSON on
stdout. A trace over ``--max-bytes`` is cut to the leading whole steps that fit
(``cut``), in a second pass that writes only what it keeps; exit status
``EXIT_TOO_LARGE`` when not even one step fits.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from actors.export.contract import (
    EXIT_MALFORMED,
    EXIT_TOO_LARGE,
    MAX_BYTES_FLAG,
    MEMORY_FLAG,
    MEMORY_NAME,
    OPS_NAME,
    SHAPES_FLAG,
    TRACE_NAME,
    ExportResult,
)
from actors.export.cut import plan_cut, write_kept
from actors.export.reader import MalformedTrace, TraceReader
from actors.export.tables import OP_COLUMNS, MemoryTimeline, OpTable, StepSpans

__all__ = ["OP_COLUMNS", "TRIM_LIMIT_FACTOR", "main", "op_table", "step_spans"]

# Far over the cap, refuse without reading: cutting costs two full parses of
# the trace on the training node's CPU to keep a small part of it.
TRIM_LIMIT_FACTOR = 2
# Level 6 is within a few percent of 9 on traces at a third of the CPU.
_GZIP_LEVEL = 6


def step_spans(events: Iterable[Any]) -> dict[int, float]:
    """``ProfilerStep#N`` -> duration in ms."""
    spans = StepSpans()
    for ev in events:
        if isinstance(ev, dict):
            spans.add(ev)
    return spans.steps


def op_table(events: Iterable[Any], *, by_shape: bool) -> list[list[Any]]:
    """Per-operator totals like ``key_averages()`` (see :class:`~actors.export.tables.OpTable`)."""
    table = OpTable(by_shape=by_shape)
    for ev in events:
        if isinstance(ev, dict):
            table.add(ev)
    return table.rows()


class _Artifacts:
    """Everything computed from the events that end up in ``trace.json.gz``."""

    def __init__(self, *, memory: bool, by_shape: bool) -> None:
        self.spans = StepSpans()
        self.ops = OpTable(by_shape=by_shape)
        self.memory = MemoryTimeline() if memory else None

    def add(self, ev: Any) -> None:
        if type(ev) is not dict:
            return
        # Complete events feed the steps and the op table; only [memory] instants the timeline.
        if ev.get("ph") == "X":
            self.spans.add(ev)
            self.ops.add(ev)
        elif self.memory is not None:
            self.memory.add(ev)

    def write(self, out: Path, header: dict[str, Any]) -> None:
        if self.memory is not None:
            with gzip.open(out / MEMORY_NAME, "wt", encoding="utf-8") as f:
                self.memory.write(f, header.get("baseTimeNanoseconds"))
        with open(out / OPS_NAME, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(OP_COLUMNS)
            writer.writerows(self.ops.rows())


def _export(raw: Path, out: Path, artifacts: _Artifacts, cap: int | None) -> tuple[dict[str, Any], bool] | None:
    """Write ``trace.json.gz`` (cut when over ``cap``) while feeding ``artifacts``; ``None`` when nothing fits."""
    if cap is None or raw.stat().st_size <= cap:
        # One pass: the file's bytes are compressed as they are read, events parsed from the same reads.
        with gzip.open(out / TRACE_NAME, "wb", compresslevel=_GZIP_LEVEL) as gz:
            reader = TraceReader(raw, on_bytes=gz.write)
            for ev, _, _ in reader.events():
                artifacts.add(ev)
        return reader.header, False
    first = TraceReader(raw)
    cut = plan_cut(first.events(), first.header, cap)
    if cut is None:
        return None
    second = TraceReader(raw, keep_text=True)
    with gzip.open(out / TRACE_NAME, "wt", encoding="utf-8", compresslevel=_GZIP_LEVEL) as gz:
        for ev in write_kept(gz, second.events(), cut, first.header):
            artifacts.add(ev)
    return first.header, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(MEMORY_FLAG, action="store_true")
    parser.add_argument(SHAPES_FLAG, action="store_true")
    parser.add_argument(MAX_BYTES_FLAG, type=int, default=None)
    args = parser.parse_args(argv)

    raw_bytes = args.raw.stat().st_size
    cap = args.max_bytes
    if cap is not None and raw_bytes > TRIM_LIMIT_FACTOR * cap:
        print(f"trace is {raw_bytes} bytes, more than {TRIM_LIMIT_FACTOR}x the cap of {cap} bytes", file=sys.stderr)
        return EXIT_TOO_LARGE
    artifacts = _Artifacts(memory=args.memory, by_shape=args.shapes)
    try:
        exported = _export(args.raw, args.out, artifacts, cap)
    except MalformedTrace as e:
        print(f"cannot read the trace: {e}", file=sys.stderr)
        return EXIT_MALFORMED
    if exported is None:
        print(f"trace is {raw_bytes} bytes and its first step alone is over the cap of {cap} bytes", file=sys.stderr)
        return EXIT_TOO_LARGE
    header, cut = exported
    artifacts.write(args.out, header)
    result = ExportResult(
        steps=artifacts.spans.steps, base_time_ns=header.get("baseTimeNanoseconds"), raw_bytes=raw_bytes, cut=cut
    )
    sys.stdout.write(result.to_json())
    return 0
