"""Merge all ranks of one profile into a single Chrome/Perfetto trace (``.json.gz``).

What the merged trace keeps apart and lines up:

* **Processes.** Each rank's processes get new pids ``(rank + 1) * PID_STRIDE + k``
  (k in order of first sight; never 0, which viewers treat as the idle task),
  so ranks never collide and sort by rank. The
  rank's main process (the one with the ``ProfilerStep#`` spans) is named
  ``rank R (host)``; its other processes (GPU devices, kineto's span rows)
  ``rank R (host) <original name>``. ``process_sort_index`` follows the same order.
* **Clocks.** torch writes ``ts`` in µs relative to ``baseTimeNanoseconds``
  (checked on torch 2.13 exports: base + ts is wall-clock time). Every rank is
  shifted onto the earliest base, which the merged trace carries as its own
  ``baseTimeNanoseconds``.
* **Ids.** Flow and async ``id``, ``args.correlation`` and ``args["External id"]``
  become ``rank * 2**40 + id`` (strings: ``"r<rank>:<id>"``), so links never
  cross ranks; ``2**40 * rank`` stays exact in a double for 8192 ranks.
* **Metadata.** ``deviceProperties`` of all ranks (each tagged with ``rank``)
  and a ``rayprof`` section listing each rank's source file and header.

It streams: one event of one rank is in memory at a time (plus a small write
batch), so the merge's footprint does not grow with the traces. The output is
written to a temporary name and renamed into place when complete. A rank
whose file turns out damaged mid-way keeps the events read so far and is
reported in ``MergeStats.truncated`` and labelled ``[truncated]``.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict

from orchestrator.layout import parse_profiler_step
from orchestrator.traces.loader import RejectedTrace, TraceFile, TraceSet, discover_traces
from orchestrator.traces.stream import TraceParseError, iter_trace, read_header

__all__ = ["ID_STRIDE", "PID_STRIDE", "MergeStats", "merge_folder", "merge_traces"]

PID_STRIDE = 1000
ID_STRIDE = 2**40
# Level 6 halves the time of gzip's default 9 for a few percent more bytes.
COMPRESS_LEVEL = 6
_WRITE_BATCH = 500
_PROCESS_METADATA = frozenset({"process_name", "process_labels", "process_sort_index"})
_ID_ARGS = ("correlation", "External id")


class MergeStats(BaseModel):
    """What a merge read and wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: list[int]
    events: int
    input_bytes: int
    output_bytes: int
    seconds: float
    skipped: list[RejectedTrace] = []
    truncated: list[RejectedTrace] = []


def _new_id(value: Any, rank: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return rank * ID_STRIDE + value
    if isinstance(value, str):
        return f"r{rank}:{value}"
    return value


class _RankWriter:
    """Rewrites one rank's events into the merged trace's pid, clock and id spaces."""

    def __init__(self, trace: TraceFile, reference_base_ns: int) -> None:
        self.trace = trace
        self.shift_us = (trace.base_time_ns - reference_base_ns) / 1000
        self.pids: dict[Any, int] = {}
        self.names: dict[Any, str] = {}
        self.main_pid: Any = None
        self.header: dict[str, Any] = {}
        self.events = 0

    def pid(self, original: Any) -> int:
        if original not in self.pids:
            # Beyond PID_STRIDE processes in one rank the next rank's range would
            # be entered; kineto writes a handful (CPU, GPUs, span rows).
            self.pids[original] = (self.trace.rank + 1) * PID_STRIDE + len(self.pids)
        return self.pids[original]

    def rewrite(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event in merged-trace terms, or None for process metadata this rank replaces."""
        pid = event.get("pid")
        if event.get("ph") == "M" and event.get("name") in _PROCESS_METADATA:
            if event["name"] == "process_name":
                self.names[pid] = str((event.get("args") or {}).get("name", pid))
            return None  # replaced by this rank's own labels in metadata()
        if self.main_pid is None and parse_profiler_step(str(event.get("name", ""))) is not None:
            self.main_pid = pid
        new_pid = self.pids.get(pid)
        event["pid"] = new_pid if new_pid is not None else self.pid(pid)
        ts = event.get("ts")
        if ts.__class__ is float or ts.__class__ is int:
            event["ts"] = ts + self.shift_us
        if "id" in event:
            event["id"] = _new_id(event["id"], self.trace.rank)
        args = event.get("args")
        if args.__class__ is dict:
            for key in _ID_ARGS:
                if key in args:
                    args[key] = _new_id(args[key], self.trace.rank)
        self.events += 1
        return event

    def metadata(self, truncated: bool) -> list[dict[str, Any]]:
        """process_name / process_sort_index for every process this rank used."""
        rank, host = self.trace.rank, self.trace.host or "unknown host"
        label = f"rank {rank} ({host})" + (" [truncated]" if truncated else "")
        main = self.main_pid if self.main_pid in self.pids else next(iter(self.pids), None)
        out: list[dict[str, Any]] = []
        others = [p for p in self.pids if p != main]
        for order, original in enumerate([main, *others] if main is not None else []):
            name = label if original == main else f"{label} {self.names.get(original, original) or 'markers'}"
            pid = self.pids[original]
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank * PID_STRIDE + order}})
        return out


def _as_trace_files(traces: TraceSet | Iterable[TraceFile | tuple[int, str | None, Path]]) -> tuple[list[TraceFile], list[RejectedTrace]]:
    if isinstance(traces, TraceSet):
        return list(traces.files), list(traces.rejected)
    files: list[TraceFile] = []
    skipped: list[RejectedTrace] = []
    for item in traces:
        if isinstance(item, TraceFile):
            files.append(item)
            continue
        rank, host, path = item
        try:
            header = read_header(Path(path))
        except TraceParseError as exc:
            skipped.append(RejectedTrace(path=Path(path), rank=rank, reason=f"unreadable trace: {exc}"))
            continue
        base = header.get("baseTimeNanoseconds", 0)
        files.append(TraceFile(rank=rank, path=Path(path), host=host, base_time_ns=base if isinstance(base, int) else 0))
    counts: dict[int, list[TraceFile]] = {}
    for tf in files:
        counts.setdefault(tf.rank, []).append(tf)
    kept = []
    for rank in sorted(counts):
        if len(counts[rank]) == 1:
            kept.append(counts[rank][0])
        else:
            names = ", ".join(tf.path.name for tf in counts[rank])
            skipped += [RejectedTrace(path=tf.path, rank=rank, reason=f"duplicate rank {rank}: claimed by {names}") for tf in counts[rank]]
    return kept, skipped


def merge_traces(traces: TraceSet | Iterable[TraceFile | tuple[int, str | None, Path]], out: Path) -> MergeStats:
    """Write all ranks' traces into one gzipped Chrome trace at ``out``; ranks in rank order.

    ``traces`` is a :class:`TraceSet` from :func:`discover_traces`, or
    ``TraceFile`` objects, or ``(rank, host, path)`` tuples. A duplicate rank
    or an unreadable file is skipped with its reason in ``MergeStats.skipped``.
    """
    started = time.perf_counter()
    files, skipped = _as_trace_files(traces)
    files.sort(key=lambda tf: tf.rank)
    reference = min((tf.base_time_ns for tf in files), default=0)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    truncated: list[RejectedTrace] = []
    ranks_info: list[dict[str, Any]] = []
    device_properties: list[dict[str, Any]] = []
    events = 0
    try:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=COMPRESS_LEVEL) as sink:
            sink.write('{"traceEvents":[')
            array = _JsonArray(sink)
            for tf in files:
                writer = _RankWriter(tf, reference)
                reason = _copy_rank(tf, writer, array)
                if reason is not None:
                    truncated.append(RejectedTrace(path=tf.path, rank=tf.rank, reason=reason))
                array.extend([json.dumps(m) for m in writer.metadata(truncated=reason is not None)])
                events += writer.events
                for props in writer.header.get("deviceProperties") or []:
                    if isinstance(props, dict):
                        device_properties.append({**props, "rank": tf.rank})
                ranks_info.append(
                    {
                        "rank": tf.rank,
                        "host": tf.host,
                        "file": tf.path.name,
                        "baseTimeNanoseconds": tf.base_time_ns,
                        "pids": {str(k): v for k, v in writer.pids.items()},
                        "distributedInfo": writer.header.get("distributedInfo"),
                        "events": writer.events,
                    }
                )
            tail = {
                "displayTimeUnit": "ms",
                "baseTimeNanoseconds": reference,
                "deviceProperties": device_properties,
                "rayprof": {"ranks": ranks_info},
            }
            sink.write("]," + json.dumps(tail)[1:])
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return MergeStats(
        ranks=[tf.rank for tf in files],
        events=events,
        input_bytes=sum(tf.path.stat().st_size for tf in files),
        output_bytes=out.stat().st_size,
        seconds=time.perf_counter() - started,
        skipped=skipped,
        truncated=truncated,
    )


class _JsonArray:
    """Writes already-encoded items into an open JSON array, commas included."""

    def __init__(self, sink: TextIO) -> None:
        self._sink = sink
        self._empty = True

    def extend(self, items: list[str]) -> None:
        if items:
            self._sink.write(("" if self._empty else ",") + ",".join(items))
            self._empty = False


def _copy_rank(tf: TraceFile, writer: _RankWriter, array: _JsonArray) -> str | None:
    """Stream one rank's events into ``array``; the reason it stopped early, if it did."""
    batch: list[dict[str, Any]] = []
    # One encoder call per batch: per-event calls would cost more than the parse.
    encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    try:
        for kind, key, value in iter_trace(tf.path):
            if kind == "key":
                writer.header[key] = value
                continue
            event = writer.rewrite(value)
            if event is not None:
                batch.append(event)
            if len(batch) >= _WRITE_BATCH:
                array.extend([encode(batch)[1:-1]])
                batch = []
    except TraceParseError as exc:
        return f"damaged after {writer.events} events: {exc}"
    finally:
        if batch:
            array.extend([encode(batch)[1:-1]])
    return None


def merge_folder(folder: Path, out: Path) -> MergeStats:
    """Discover the rank traces in ``folder`` (see :func:`discover_traces`) and merge them into ``out``."""
    return merge_traces(discover_traces(Path(folder)), out)
