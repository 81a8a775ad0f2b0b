"""Merge all ranks of one profile into a single Chrome/Perfetto trace (``.json.gz``) within a byte budget.

Two streaming passes over the ranks, one batch of one rank in memory at a time:

1. **Scan** (typed, args left undecoded): per rank, the bytes each kind of
   event would take, by duration, and the end times of its collectives.
2. **Write**: every event when the estimate fits ``max_bytes`` (raw JSON,
   ``RAYPROF_MAX_MERGED_BYTES``); otherwise metadata and ``ProfilerStep#``
   markers, then collectives and copies, then the longest other spans (ops,
   kernels, runtime calls) down to the duration that fills the budget; flows,
   instants and counters go first. What was dropped is in
   :attr:`MergeStats.dropped` and in the trace's ``rayprof.dropped``. The
   budget is a hard cap: past it only markers are written.

What the merged trace keeps apart and lines up:

* **Processes.** Rank R's processes get pids ``(R + 1) * PID_STRIDE + k`` (never
  0, which viewers treat as the idle task), named ``rank R (host)`` for the one
  with ``ProfilerStep#`` spans and ``rank R (host) <original name>`` for the rest.
* **Clocks.** torch writes ``ts`` in µs relative to ``baseTimeNanoseconds``; every
  rank is first put on the earliest base. Where ranks share collectives, each is
  then shifted by the median difference of its collectives' end times from the
  lowest such rank's (a collective ends together on all ranks; the k-th of a
  name is matched with the k-th). :attr:`MergeStats.alignment` gives each rank's
  shift and residual error (median and largest distance left).
* **Ids.** Flow and async ``id``, ``args.correlation`` and ``args["External id"]``
  become ``rank * 2**40 + id`` (strings ``"r<rank>:<id>"``), so links never cross ranks.

A rank whose file is damaged mid-way keeps the events before the damage and is
reported in ``truncated`` and labelled ``[truncated]``. The output is written
under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import gzip
import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict

from orchestrator import settings
from orchestrator.layout import parse_profiler_step
from orchestrator.traces.loader import (
    TIME_RANGE_US,
    RejectedTrace,
    TraceFile,
    TraceSet,
    canonical_category,
    discover_traces,
)
from orchestrator.traces.stream import TraceParseError, TraceReader, read_header

__all__ = ["ID_STRIDE", "PID_STRIDE", "DroppedEvents", "MergeStats", "RankAlignment", "merge_folder", "merge_traces"]

PID_STRIDE = 1000
ID_STRIDE = 2**40
# Level 3 compresses ~3x faster than 6 for ~20% more bytes (measured on a V100 trace).
COMPRESS_LEVEL = 3
# Small batches keep decoded dicts (several times their JSON) to a few MB.
_BATCH_BYTES = 256 << 10
_SAFETY = 0.95  # the estimate runs above the written size; this covers the rest
_PROCESS_METADATA = frozenset({"process_name", "process_labels", "process_sort_index"})
_ID_ARGS = ("correlation", "External id")
_HOST_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
_MAX_COLLECTIVES = 4096  # per rank: plenty for a median, bounded memory
_MARKER, _COMM, _SPAN, _OTHER = range(4)
_TIER_NAMES = ("markers", "collectives and copies", "ops and kernels", "flows, instants and counters")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RankAlignment(_Model):
    """How one rank's clock was put on the merged trace's."""

    rank: int
    method: Literal["collectives", "base time"]
    shift_us: float  # added to the rank's own timestamps
    matched: int = 0  # collectives matched with the reference rank
    residual_us: float | None = None  # median |end - reference end| after the shift
    max_residual_us: float | None = None


class DroppedEvents(_Model):
    """What a merge over budget left out."""

    events: int
    by_kind: dict[str, int]
    min_span_us: float | None = None  # ops and kernels shorter than this were dropped
    min_comm_us: float | None = None  # collectives and copies shorter than this were dropped
    reason: str


class MergeStats(_Model):
    """What a merge read and wrote."""

    ranks: list[int]
    events: int
    input_bytes: int
    output_bytes: int
    seconds: float
    skipped: list[RejectedTrace] = []
    truncated: list[RejectedTrace] = []
    input_raw_bytes: int = 0
    output_raw_bytes: int = 0
    max_bytes: int = settings.DEFAULT_MAX_MERGED_BYTES
    dropped: DroppedEvents | None = None
    alignment: list[RankAlignment] = []


class _ScanEvent(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw()


def _bucket(dur: float) -> int:
    """Quarter-octave duration bucket: 0 for <= 2**-10 µs, 255 for >= 2**53.75 µs."""
    if dur <= 0.001:
        return 0
    bucket = int(4 * math.log2(dur)) + 40
    return bucket if bucket < 255 else 255


def _bucket_floor_us(bucket: int) -> float:
    return 2 ** ((bucket - 40) / 4)


def _classify(ph: str, raw_cat: str, name: str) -> tuple[int, bool, bool]:
    """(tier, whether it is a collective that ends together on every rank, whether it is a device event).

    NCCL kernels and gloo's worker-thread ops end together on all ranks;
    ``c10d::``, ``nccl:`` and ``record_param_comms`` host ops only enqueue the
    work, so their ends drift and are not used to align clocks.
    """
    cat = canonical_category(raw_cat)
    if ph == "M" or (ph == "X" and name.startswith("ProfilerStep#")):
        return _MARKER, False, False
    if ph != "X":
        return _OTHER, False, False
    device_comm = cat == "kernel" and "nccl" in name.lower()
    if device_comm or name.startswith(_HOST_COMM_PREFIXES):
        return _COMM, device_comm or name.startswith("gloo:"), cat == "kernel"
    if cat == "gpu_memcpy" or (cat in ("cuda_runtime", "cuda_driver") and "Memcpy" in name):
        return _COMM, False, False
    return _SPAN, False, False


def _new_metadata(seen: set[tuple[Any, Any, Any]], name: Any, pid: Any, tid: Any) -> bool:
    """Whether a metadata event is written: process labels are replaced, repeats dropped."""
    if not isinstance(name, str) or name in _PROCESS_METADATA:
        return False
    if not isinstance(pid, int | str) or not isinstance(tid, int | str | None):
        return False
    key = (name, pid, tid)
    if key in seen:
        return False
    seen.add(key)
    return True


class _Scan:
    """Pass 1 over one rank: byte estimates by tier and duration, collective end times, damage."""

    def __init__(self, tf: TraceFile) -> None:
        self.tf = tf
        self.histogram = [0] * (4 * 256)  # estimated bytes by tier * 256 + duration bucket
        self.ends: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
        self.good_events: int | None = None  # events before damage, when damaged
        self.reason: str | None = None
        self.raw_bytes = 0
        collectives = seen = 0
        classes: dict[tuple[str, str, str], tuple[int, bool, bool]] = {}
        metadata: set[tuple[Any, Any, Any]] = set()
        histogram, log2 = self.histogram, math.log2
        reader = TraceReader(tf.path, _ScanEvent)
        try:
            for kind, _, batch in reader:
                if kind == "key":
                    continue
                for e in batch:
                    if e.ts is not None and not -TIME_RANGE_US < e.ts + e.dur < TIME_RANGE_US:
                        raise TraceParseError(f"event {seen}: time {e.ts + e.dur:g} µs is beyond what any clock writes")
                    seen += 1
                    key = (e.ph, e.cat, e.name)
                    found = classes.get(key)
                    tier, together, device = found if found is not None else classes.setdefault(key, _classify(*key))
                    if tier == _MARKER and e.ph == "M" and not _new_metadata(metadata, e.name, e.pid, e.tid):
                        continue
                    dur = e.dur  # _bucket, inlined: this loop runs once per event
                    bucket = 0 if dur <= 0.001 else int(4 * log2(dur)) + 40
                    histogram[tier * 256 + (bucket if bucket < 255 else 255)] += 90 + len(key[1]) + len(key[2]) + len(e.args)
                    if together and e.ts is not None and collectives < _MAX_COLLECTIVES:
                        self.ends[device][e.name].append(e.ts + dur)
                        collectives += 1
        except TraceParseError as exc:
            self.good_events, self.reason = seen, str(exc)
        self.raw_bytes = reader.bytes_read
        for by_name in self.ends.values():
            for ends in by_name.values():
                ends.sort()  # files are not in time order across threads; the k-th is the k-th in time

    def tier(self, tier: int) -> list[int]:
        return self.histogram[tier * 256 : (tier + 1) * 256]


def _threshold(histogram: list[int], room: float) -> int:
    """The lowest bucket such that it and every longer one fit in ``room`` bytes (256: none fit)."""
    used = 0
    for bucket in range(255, -1, -1):
        used += histogram[bucket]
        if used > room:
            return bucket + 1
    return 0


def _align(scans: list[_Scan], reference_ns: int) -> list[RankAlignment]:
    """Each rank's shift: base time, refined by collective end times where ranks share some."""
    base = {s.tf.rank: (s.tf.base_time_ns - reference_ns) / 1000 for s in scans}
    device = all(s.ends[True] for s in scans)
    with_comm = [s for s in scans if s.ends[device]]
    ref = with_comm[0] if with_comm else None
    out: dict[int, RankAlignment] = {}
    for s in scans:
        rank = s.tf.rank
        diffs: list[float] = []
        if ref is not None and s is not ref:
            for name, ends in s.ends[device].items():
                ref_ends = ref.ends[device].get(name, [])
                diffs += [(r + base[ref.tf.rank]) - (e + base[rank]) for r, e in zip(ref_ends, ends)]
        if not diffs:
            out[rank] = RankAlignment(rank=rank, method="base time", shift_us=base[rank])
            continue
        offset = statistics.median(diffs)
        residuals = [abs(d - offset) for d in diffs]
        out[rank] = RankAlignment(
            rank=rank, method="collectives", shift_us=base[rank] + offset, matched=len(diffs),
            residual_us=statistics.median(residuals), max_residual_us=max(residuals),
        )
    if ref is not None and any(a.method == "collectives" for a in out.values()):
        # The reference defines the merged clock: its residual is zero by construction.
        rank = ref.tf.rank
        out[rank] = RankAlignment(rank=rank, method="collectives", shift_us=base[rank], residual_us=0.0, max_residual_us=0.0)
    return [out[s.tf.rank] for s in scans]


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
        self.header: dict[str, Any] = {}
        self.events = 0

    def pid(self, original: Any) -> int:
        if original not in self.pids:
            # Beyond PID_STRIDE processes in one rank the next rank's range would
            # be entered; kineto writes a handful (CPU, GPUs, span rows).
            self.pids[original] = (self.trace.rank + 1) * PID_STRIDE + len(self.pids)
        return self.pids[original]

    def rewrite(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event in merged-trace terms, or None for metadata this rank replaces or repeats."""
        pid, name = event.get("pid"), event.get("name")
        if pid.__class__ is not int and not isinstance(pid, str | float | None):
            pid = repr(pid)  # a list or object is no process id, but must not stop the merge
        if event.get("ph") == "M":
            if name == "process_name" and isinstance(event.get("args"), dict):
                self.names.setdefault(pid, str(event["args"].get("name", pid)))
            # Process labels are replaced by this rank's own in metadata(); some
            # tracers (MTIA) repeat thread names thousands of times.
            if not _new_metadata(self.seen_metadata, name, pid, event.get("tid")):
                return None
        if self.main_pid is None and name.__class__ is str and name.startswith("ProfilerStep#") and parse_profiler_step(name) is not None:
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
                value = args.get(key)
                if value.__class__ is int:
                    args[key] = self.id_base + value
                elif value is not None:
                    args[key] = _new_id(value, self.trace.rank)
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


class _Sink:
    """The open gzip file and the JSON array inside it; counts raw bytes and enforces the cap."""

    def __init__(self, path: Path, cap: int) -> None:
        self._file = gzip.open(path, "wb", compresslevel=COMPRESS_LEVEL)
        self._encode = msgspec.json.Encoder().encode
        self.cap = cap
        self.raw = 0
        self.full = False  # the cap was reached: later capped events are dropped unencoded
        self._empty = True

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self.raw += len(data)

    def add(self, events: list[dict[str, Any]], capped: bool = True) -> int:
        """Append events; with ``capped``, only as many as fit the cap. Returns how many were left out."""
        if not events:
            return 0
        if capped and self.full:
            return len(events)
        body = self._encode(events)[1:-1]
        if capped and self.raw + len(body) + 1 > self.cap:
            parts = [self._encode(e) for e in events]
            fitting = 0
            room = self.cap - self.raw
            for part in parts:
                room -= len(part) + 1
                if room < 0:
                    break
                fitting += 1
            self.full = True
            if not fitting:
                return len(events)
            body = b",".join(parts[:fitting])
            left = len(events) - fitting
        else:
            left = 0
        self.write(body if self._empty else b"," + body)
        self._empty = False
        return left

    def close(self) -> None:
        self._file.close()


def _copy_rank(scan: _Scan, writer: _RankWriter, sink: _Sink, keep: list[int], dropped: Counter[str]) -> str | None:
    """Pass 2 over one rank: write the events ``keep`` admits (min bucket per tier); the reason it stopped early."""
    tf, budget_left = scan.tf, scan.good_events
    decode_any = msgspec.json.Decoder().decode
    everything = not any(keep)
    classes: dict[tuple[str, str, str], tuple[int, bool, bool]] = {}
    # Over budget, each batch is decoded twice in C (typed, and as raw bytes per
    # event) so that only the events kept are turned into dicts.
    reader = TraceReader(tf.path, Any if everything else (_ScanEvent, msgspec.Raw), max_batch=_BATCH_BYTES)
    try:
        for kind, key, batch in reader:
            if kind == "key":
                writer.header[key] = batch
                continue
            items = batch if everything else zip(*batch)
            if budget_left is not None:
                items = list(items)[:budget_left]
                budget_left -= len(items)
            markers: list[dict[str, Any]] = []
            kept: list[dict[str, Any]] = []
            for item in items:
                if everything:
                    if item.__class__ is not dict:
                        continue
                    event, name = item, item.get("name")
                    marker = item.get("ph") == "M" or (name.__class__ is str and name.startswith("ProfilerStep#"))
                else:
                    e, raw = item
                    found = classes.get(cls_key := (e.ph, e.cat, e.name))
                    tier = (found if found is not None else classes.setdefault(cls_key, _classify(*cls_key)))[0]
                    if _bucket(e.dur) < keep[tier]:
                        dropped[_TIER_NAMES[tier]] += 1
                        continue
                    event, marker = decode_any(raw), tier == _MARKER
                if (event := writer.rewrite(event)) is not None:
                    (markers if marker else kept).append(event)
            sink.add(markers, capped=False)
            left = sink.add(kept)
            if left:
                dropped["at the byte cap"] += left
                writer.events -= left
            if budget_left is not None and budget_left <= 0:
                break
    except (TraceParseError, msgspec.DecodeError, RecursionError) as exc:
        return f"damaged after {writer.events} events: {exc}"
    if scan.reason is not None:
        return f"damaged after {writer.events} events: {scan.reason}"
    return None


def _plan(scans: list[_Scan], max_bytes: int) -> tuple[list[int], str | None]:
    """Min duration bucket per tier (0: all, 256: none), and why anything is left out."""
    merged = [[sum(col) for col in zip(*(s.tier(t) for s in scans))] or [0] * 256 for t in range(4)]
    totals = [sum(h) for h in merged]
    if sum(totals) <= max_bytes * _SAFETY:
        return [0, 0, 0, 0], None
    room = max_bytes * _SAFETY - totals[_MARKER]
    comm = _threshold(merged[_COMM], room)
    spans = _threshold(merged[_SPAN], room - totals[_COMM]) if comm == 0 else 256
    why = (
        f"about {sum(totals) / 2**20:.0f} MiB of events is over the {max_bytes / 2**20:.0f} MiB budget "
        f"({settings.MAX_MERGED_BYTES_ENV_VAR}): kept step markers, collectives, copies and the longest ops and kernels"
    )
    return [0, comm, spans, 256], why


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
    traces: TraceSet | Iterable[TraceFile | tuple[int, str | None, Path]], out: Path, *, max_bytes: int | None = None
) -> MergeStats:
    """Write all ranks' traces into one gzipped Chrome trace at ``out``; ranks in rank order.

    ``traces`` is a :class:`TraceSet` from :func:`discover_traces`, or
    ``TraceFile`` objects, or ``(rank, host, path)`` tuples. A duplicate rank
    or an unreadable file is skipped with its reason in ``MergeStats.skipped``.
    ``max_bytes`` (raw JSON) defaults to ``RAYPROF_MAX_MERGED_BYTES``.
    """
    started = time.perf_counter()
    if max_bytes is None:
        max_bytes = settings.env_int(settings.MAX_MERGED_BYTES_ENV_VAR, settings.DEFAULT_MAX_MERGED_BYTES)
    files, skipped = _as_trace_files(traces)
    files.sort(key=lambda tf: tf.rank)
    reference = min((tf.base_time_ns for tf in files), default=0)
    scans = [_Scan(tf) for tf in files]
    alignment = _align(scans, reference)
    keep, why = _plan(scans, max_bytes)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    truncated: list[RejectedTrace] = []
    ranks_info: list[dict[str, Any]] = []
    device_properties: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    events = 0
    try:
        # Room for each rank's process labels and header in the trailer.
        sink = _Sink(tmp, cap=max_bytes - (32 << 10) * (len(files) + 2))
        try:
            sink.write(b'{"traceEvents":[')
            for scan, aligned in zip(scans, alignment):
                tf = scan.tf
                writer = _RankWriter(tf, aligned.shift_us)
                reason = _copy_rank(scan, writer, sink, keep, dropped)
                if reason is not None:
                    truncated.append(RejectedTrace(path=tf.path, rank=tf.rank, reason=reason))
                sink.add(writer.metadata(truncated=reason is not None), capped=False)
                events += writer.events
                for props in writer.header.get("deviceProperties") or []:
                    if isinstance(props, dict):
                        device_properties.append({**props, "rank": tf.rank})
                ranks_info.append(
                    {
                        "rank": tf.rank, "host": tf.host, "file": tf.path.name, "baseTimeNanoseconds": tf.base_time_ns,
                        "pids": {str(k): v for k, v in writer.pids.items()}, "events": writer.events,
                        "distributedInfo": writer.header.get("distributedInfo"), "alignment": aligned.model_dump(),
                    }
                )
            drop = None
            if dropped or why:
                floors = [None if k in (0, 256) else round(_bucket_floor_us(k), 3) for k in keep]
                drop = DroppedEvents(
                    events=sum(dropped.values()), by_kind=dict(dropped), min_comm_us=floors[_COMM],
                    min_span_us=floors[_SPAN], reason=why or "the byte cap was reached",
                )
            tail = {
                "displayTimeUnit": "ms",
                "baseTimeNanoseconds": reference,
                "deviceProperties": device_properties,
                "rayprof": {"ranks": ranks_info, "max_bytes": max_bytes, "dropped": drop.model_dump() if drop else None},
            }
            sink.write(b"]," + msgspec.json.encode(tail)[1:])
        finally:
            sink.close()
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
        input_raw_bytes=sum(s.raw_bytes for s in scans),
        output_raw_bytes=sink.raw,
        max_bytes=max_bytes,
        dropped=drop,
        alignment=alignment,
    )


def merge_folder(folder: Path, out: Path, *, max_bytes: int | None = None) -> MergeStats:
    """Discover the rank traces in ``folder`` (see :func:`discover_traces`) and merge them into ``out``."""
    return merge_traces(discover_traces(Path(folder)), out, max_bytes=max_bytes)
