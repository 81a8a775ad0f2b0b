"""Merge all ranks of one profile into a single Chrome/Perfetto trace (``.json.gz``) within a byte budget.

Two streaming passes over each rank, one batch of one rank in memory at a
time, each rank's passes run through a :data:`~orchestrator.traces.fanout.RankMap`
(one rank after another here, Ray tasks in the controller):

1. **Scan** (:func:`~orchestrator.traces.merge_plan.scan_rank`, or the same
   scan riding on the analysis's read of the rank: ``scans``), then the caller
   aligns the clocks and plans what fits ``max_bytes`` (raw JSON,
   ``RAYPROF_MAX_MERGED_BYTES``): everything when it fits, otherwise markers,
   then collectives and copies, then the longest other spans. What was dropped
   is in :attr:`MergeStats.dropped` and the trace's ``rayprof.dropped``. The
   budget is a hard cap: past it only markers are written.
2. **Write** (:func:`write_rank`): each rank's kept events, rewritten, as its
   own deflate stream ended by a sync flush. Such streams concatenate into one
   valid deflate stream, so the caller writes one ordinary single-member gzip
   file from the ranks' parts without recompressing anything.

What the merged trace keeps apart and lines up:

* **Processes.** Rank R's processes get pids ``(R + 1) * PID_STRIDE + k`` (never
  0, which viewers treat as the idle task), named ``rank R (host)`` for the one
  with ``ProfilerStep#`` spans and ``rank R (host) <original name>`` for the rest.
* **Clocks.** Every rank is put on the earliest ``baseTimeNanoseconds``, then,
  where ranks share collectives, shifted by the median difference of their end
  times (see :func:`~orchestrator.traces.merge_plan.align`); each rank's shift
  and residual error are in :attr:`MergeStats.alignment`.
* **Ids.** Flow and async ``id``, ``args.correlation`` and ``args["External id"]``
  become ``rank * 2**40 + id`` (strings ``"r<rank>:<id>"``), so links never cross ranks.

A rank whose file is damaged mid-way keeps the events before the damage and is
reported in ``truncated`` and labelled ``[truncated]``. The output is written
under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import os
import time
import zlib
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec

from orchestrator import settings
from orchestrator.layout import parse_profiler_step
from orchestrator.merge_stats import DroppedEvents, MergeStats, RankAlignment
from orchestrator.traces.fanout import RankMap, serial
from orchestrator.traces.gcpause import gc_paused
from orchestrator.traces.gzjoin import Deflate, GzipFile
from orchestrator.traces.loader import RejectedTrace, TraceFile, TraceSet, discover_traces
from orchestrator.traces.merge_plan import (
    MARKER,
    TIER_NAMES,
    RankScan,
    align,
    bucket_floor_us,
    new_metadata,
    plan,
    scan_ranks,
)
from orchestrator.traces.stream import TraceParseError, TraceReader, read_header

__all__ = ["ID_STRIDE", "PID_STRIDE", "DroppedEvents", "MergeStats", "RankAlignment", "merge_folder", "merge_traces"]

PID_STRIDE = 1000
ID_STRIDE = 2**40
# Small batches keep decoded dicts (several times their JSON) to a few MB.
_BATCH_BYTES = 256 << 10
_ID_ARGS = ("correlation", "External id")
_HEADER_KEYS = ("deviceProperties", "distributedInfo")
_DICTS = msgspec.json.Decoder(list[Any])


def _new_id(value: Any, rank: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return rank * ID_STRIDE + value
    if isinstance(value, str):
        return f"r{rank}:{value}"
    return value


class _RankWriter:
    """Rewrites one rank's events into the merged trace's pid, clock and id spaces."""

    def __init__(self, trace: TraceFile, shift_us: float) -> None:
        self.trace = trace
        self.shift_us = shift_us
        self.id_base = trace.rank * ID_STRIDE
        self.pids: dict[Any, int] = {}
        self.names: dict[Any, str] = {}
        self.seen_metadata: set[tuple[Any, Any, Any]] = set()
        self.main_pid: Any = None
        self.events = 0

    def pid(self, original: Any) -> int:
        if original not in self.pids:
            # Beyond PID_STRIDE processes in one rank the next rank's range would
            # be entered; kineto writes a handful (CPU, GPUs, span rows).
            self.pids[original] = (self.trace.rank + 1) * PID_STRIDE + len(self.pids)
        return self.pids[original]

    def rewrite_all(self, raws: list[msgspec.Raw]) -> list[dict[str, Any]]:
        """The events decoded in one call and put in merged-trace terms, less metadata this rank
        replaces or repeats: one loop with its lookups bound to locals, as it runs for every event."""
        if not raws:
            return []
        out: list[dict[str, Any]] = []
        append, pids, shift, rank, id_base = out.append, self.pids, self.shift_us, self.trace.rank, self.id_base
        for event in _DICTS.decode(b"".join((b"[", b",".join(raws), b"]"))):
            pid, name = event.get("pid"), event.get("name")
            if pid.__class__ is not int and not isinstance(pid, str | float | None):
                pid = repr(pid)  # a list or object is no process id, but must not stop the merge
            if event.get("ph") == "M":
                if name == "process_name" and isinstance(event.get("args"), dict):
                    self.names.setdefault(pid, str(event["args"].get("name", pid)))
                # Process labels are replaced by this rank's own in metadata(); some
                # tracers (MTIA) repeat thread names thousands of times.
                if not new_metadata(self.seen_metadata, name, pid, event.get("tid")):
                    continue
            if self.main_pid is None and name.__class__ is str and name.startswith("ProfilerStep#") and parse_profiler_step(name) is not None:
                self.main_pid = pid
            new_pid = pids.get(pid)
            event["pid"] = new_pid if new_pid is not None else self.pid(pid)
            ts = event.get("ts")
            if ts.__class__ is float or ts.__class__ is int:
                event["ts"] = ts + shift
            if "id" in event:
                event["id"] = _new_id(event["id"], rank)
            args = event.get("args")
            if args.__class__ is dict:
                for key in _ID_ARGS:
                    value = args.get(key)
                    if value.__class__ is int:
                        args[key] = id_base + value
                    elif value is not None:
                        args[key] = _new_id(value, rank)
            append(event)
        self.events += len(out)
        return out

    def metadata(self, truncated: bool) -> list[dict[str, Any]]:
        """process_name / process_sort_index for every process this rank used."""
        rank, host = self.trace.rank, self.trace.host or "unknown host"
        label = f"rank {rank} ({host})" + (" [truncated]" if truncated else "")
        # The main process first; a list of labels is never empty when an event was written (the trailer relies on it).
        originals = sorted(self.pids, key=lambda p: p != self.main_pid)
        out: list[dict[str, Any]] = []
        for order, original in enumerate(originals):
            name = label if order == 0 else f"{label} {self.names.get(original, original) or 'markers'}"
            pid = self.pids[original]
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank * PID_STRIDE + order}})
        return out


class _Part(Deflate):
    """One rank's events, each followed by a comma (the trailer closes the array); enforces its cap."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self._encode = msgspec.json.Encoder().encode
        self.cap = cap
        self.full = False  # the cap was reached: later capped events are dropped unencoded

    def add(self, events: list[dict[str, Any]], capped: bool = True) -> int:
        """Append events; with ``capped``, only as many as fit the cap. Returns how many were left out."""
        if not events or (capped and self.full):
            return len(events) if events else 0
        body = self._encode(events)
        if not capped or self.raw + len(body) - 1 <= self.cap:
            self.write(memoryview(body)[1:-1])
            self.write(b",")
            return 0
        self.full = True
        room, fitting = self.cap - self.raw, 0
        for event in events:
            part = self._encode(event)
            room -= len(part) + 1
            if room < 0:
                break
            self.write(part + b",")
            fitting += 1
        return len(events) - fitting


@dataclass(frozen=True)
class WriteJob:
    """What pass 2 needs to know about one rank: its clock shift, what to keep, its cap."""

    shift_us: float
    keep: tuple[int, int, int, int]  # per tier: the shortest duration bucket kept (256: none)
    codes: bytes  # the scan's per-event codes (see RankScan.codes)
    cap: int
    good_events: int | None  # events before damage the scan found
    damage: str | None


@dataclass
class RankPart:
    """One rank's share of the merged trace: compressed events and what the caller writes around them."""

    rank: int
    data: bytes
    crc: int
    raw: int
    events: int
    metadata: bytes  # process labels as JSON objects separated by commas (b"" when it wrote no event)
    dropped: dict[str, int]
    truncated: str | None
    pids: dict[str, int]
    header: dict[str, Any]


@gc_paused
def write_rank(tf: TraceFile, job: WriteJob) -> RankPart:
    """Pass 2 over one rank: rewrite and compress the events the plan keeps."""
    writer = _RankWriter(tf, job.shift_us)
    part = _Part(job.cap)
    header: dict[str, Any] = {}
    dropped: Counter[int] = Counter()
    codes = array("H")
    codes.frombytes(zlib.decompress(job.codes))
    # Lookup tables by code (tier * 256 + bucket): the filtering runs in C, per batch, not per event in Python.
    is_marker = bytes(int(code >> 8 == MARKER) for code in range(1024))
    is_kept = bytes(int(code >> 8 != MARKER and code & 255 >= job.keep[code >> 8]) for code in range(1024))
    is_dropped = bytes(int(code & 255 < job.keep[code >> 8]) for code in range(1024))
    done, left = 0, job.good_events if job.good_events is not None else len(codes)
    reason = None
    reader = TraceReader(tf.path, msgspec.Raw, max_batch=_BATCH_BYTES)
    try:
        for kind, key, batch in reader:
            if kind == "key":
                if key in _HEADER_KEYS:
                    header[key] = batch
                continue
            raws = batch[: left - done]
            these = codes[done : done + len(raws)]
            done += len(raws)
            dropped.update(compress(these, map(is_dropped.__getitem__, these)))
            part.add(writer.rewrite_all(list(compress(raws, map(is_marker.__getitem__, these)))), capped=False)
            over = part.add(writer.rewrite_all(list(compress(raws, map(is_kept.__getitem__, these)))))
            if over:
                dropped[-1] += over
                writer.events -= over
            if done >= left:
                break
    except (TraceParseError, msgspec.DecodeError, RecursionError) as exc:
        reason = f"damaged after {writer.events} events: {exc}"
    if reason is None and job.damage is not None:
        reason = f"damaged after {writer.events} events: {job.damage}"
    labels = writer.metadata(truncated=reason is not None)
    by_kind: Counter[str] = Counter()
    for code, n in dropped.items():
        by_kind["at the byte cap" if code < 0 else TIER_NAMES[code >> 8]] += n
    return RankPart(
        rank=tf.rank, data=part.finish(), crc=part.crc, raw=part.raw, events=writer.events,
        metadata=msgspec.json.encode(labels)[1:-1], dropped=dict(by_kind), truncated=reason,
        pids={str(k): v for k, v in writer.pids.items()}, header=header,
    )


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
    counts: dict[int, list[TraceFile]] = defaultdict(list)
    for tf in files:
        counts[tf.rank].append(tf)
    kept = []
    for rank in sorted(counts):
        if len(counts[rank]) == 1:
            kept.append(counts[rank][0])
        else:
            names = ", ".join(tf.path.name for tf in counts[rank])
            skipped += [RejectedTrace(path=tf.path, rank=rank, reason=f"duplicate rank {rank}: claimed by {names}") for tf in counts[rank]]
    return kept, skipped


def merge_traces(
    traces: TraceSet | Iterable[TraceFile | tuple[int, str | None, Path]],
    out: Path,
    *,
    max_bytes: int | None = None,
    rank_map: RankMap = serial,
    scans: Mapping[int, RankScan] | None = None,
) -> MergeStats:
    """Write all ranks' traces into one gzipped Chrome trace at ``out``; ranks in rank order.

    ``traces`` is a :class:`TraceSet` from :func:`discover_traces`, or
    ``TraceFile`` objects, or ``(rank, host, path)`` tuples. A duplicate rank
    or an unreadable file is skipped with its reason in ``MergeStats.skipped``.
    ``max_bytes`` (raw JSON) defaults to ``RAYPROF_MAX_MERGED_BYTES``;
    ``rank_map`` runs the per-rank passes. ``scans`` (rank -> pass 1, from
    :func:`~orchestrator.analysis.analyze_for_merge`'s read of the same files)
    spares those ranks the scan; the others are scanned here.
    """
    started = time.perf_counter()
    if max_bytes is None:
        max_bytes = settings.env_int(settings.MAX_MERGED_BYTES_ENV_VAR, settings.DEFAULT_MAX_MERGED_BYTES)
    files, skipped = _as_trace_files(traces)
    files.sort(key=lambda tf: tf.rank)
    rank_scans = scan_ranks(files, rank_map, scans)
    alignment = align(rank_scans, min((tf.base_time_ns for tf in files), default=0))
    # Room for each rank's process labels and header in the trailer.
    the_plan = plan(rank_scans, max_bytes, cap=max_bytes - (32 << 10) * (len(files) + 2))
    jobs = [
        WriteJob(a.shift_us, the_plan.keep, s.codes, the_plan.caps[tf.rank], s.good_events, s.reason)
        for tf, s, a in zip(files, rank_scans, alignment)
    ]
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    truncated: list[RejectedTrace] = []
    ranks_info: list[dict[str, Any]] = []
    device_properties: list[dict[str, Any]] = []
    labels: list[bytes] = []
    dropped: Counter[str] = Counter()
    events = 0
    try:
        gz = GzipFile(tmp)
        try:
            gz.text(b'{"traceEvents":[')
            for tf, aligned, part in zip(files, alignment, rank_map(write_rank, list(zip(files, jobs)), "merging")):
                gz.piece(part.data, part.crc, part.raw)
                if part.truncated is not None:
                    truncated.append(RejectedTrace(path=tf.path, rank=tf.rank, reason=part.truncated))
                if part.metadata:
                    labels.append(part.metadata)
                dropped.update(part.dropped)
                events += part.events
                device_properties += [{**p, "rank": tf.rank} for p in part.header.get("deviceProperties") or [] if isinstance(p, dict)]
                ranks_info.append(
                    {
                        "rank": tf.rank, "host": tf.host, "file": tf.path.name, "baseTimeNanoseconds": tf.base_time_ns,
                        "pids": part.pids, "events": part.events, "distributedInfo": part.header.get("distributedInfo"),
                        "alignment": aligned.model_dump(),
                    }
                )
            drop = None
            if dropped or the_plan.why:
                kept_from = [None if k in (0, 256) else round(bucket_floor_us(k), 3) for k in the_plan.keep]
                drop = DroppedEvents(
                    events=sum(dropped.values()), by_kind=dict(dropped), min_comm_us=kept_from[1],
                    min_span_us=kept_from[2], reason=the_plan.why or "the byte cap was reached",
                )
            tail = {
                "displayTimeUnit": "ms",
                "baseTimeNanoseconds": min((tf.base_time_ns for tf in files), default=0),
                "deviceProperties": device_properties,
                "rayprof": {
                    "ranks": ranks_info, "max_bytes": max_bytes, "dropped": drop.model_dump() if drop else None,
                    "alignment": [a.model_dump() for a in alignment],
                },
            }
            # Every part ends with a comma; the labels (there are some whenever a part has events) close the list.
            gz.text(b",".join(labels) + b"]," + msgspec.json.encode(tail)[1:], last=True)
        finally:
            gz.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return MergeStats(
        ranks=[tf.rank for tf in files],
        events=events,
        input_bytes=sum(s.file_bytes for s in rank_scans),
        output_bytes=out.stat().st_size,
        seconds=time.perf_counter() - started,
        skipped=skipped,
        truncated=truncated,
        input_raw_bytes=sum(s.raw_bytes for s in rank_scans),
        output_raw_bytes=gz.raw,
        max_bytes=max_bytes,
        dropped=drop,
        alignment=alignment,
    )


def merge_folder(folder: Path, out: Path, *, max_bytes: int | None = None, rank_map: RankMap = serial) -> MergeStats:
    """Discover the rank traces in ``folder`` (see :func:`discover_traces`) and merge them into ``out``."""
    return merge_traces(discover_traces(Path(folder)), out, max_bytes=max_bytes, rank_map=rank_map)
