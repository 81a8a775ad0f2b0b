"""Pass 2 of the merge: one rank's kept events, rewritten into the merged trace's pid, clock and id
spaces and compressed as a deflate piece (see :mod:`orchestrator.traces.merge` for the whole)."""

from __future__ import annotations

import zlib
from array import array
from collections import Counter
from dataclasses import dataclass
from itertools import compress
from typing import Any

import msgspec

from orchestrator.layout import parse_profiler_step
from orchestrator.models.merge_stats import RankAlignment
from orchestrator.traces.discover import TraceFile
from orchestrator.traces.gcpause import gc_paused
from orchestrator.traces.gzjoin import Deflate
from orchestrator.traces.merge_plan import MARKER, TIER_NAMES, new_metadata
from orchestrator.traces.stream import TraceParseError, TraceReader

__all__ = ["ID_STRIDE", "PID_STRIDE", "RankPart", "WriteJob", "write_rank"]

PID_STRIDE = 1000
ID_STRIDE = 2**40
# Small batches keep decoded dicts (several times their JSON) to a few MB.
_BATCH_BYTES = 256 << 10
_HEADER_KEYS = ("deviceProperties", "distributedInfo")
_DICTS = msgspec.json.Decoder(list[Any])
_DROPPED, _MARKER, _KEPT = range(3)
_IS_MARKER = bytes(int(i == _MARKER) for i in range(256))
_IS_KEPT = bytes(int(i == _KEPT) for i in range(256))


def _new_id(value: Any, rank: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return rank * ID_STRIDE + value
    if isinstance(value, str):
        return f"r{rank}:{value}"
    return value


def _dicts(raws: list[msgspec.Raw]) -> list[dict[str, Any]]:
    """Raw events decoded in one call."""
    return _DICTS.decode(b"".join((b"[", b",".join(raws), b"]"))) if raws else []


class _RankWriter:
    """Rewrites one rank's events into the merged trace's pid, clock and id spaces."""

    def __init__(self, trace: TraceFile, clock: RankAlignment) -> None:
        self.trace = trace
        self.clock = clock
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

    def rewrite_markers(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The marker events (metadata and ``ProfilerStep#``) put in merged-trace terms, less metadata
        this rank replaces or repeats; the main process is the one with step markers."""
        out: list[dict[str, Any]] = []
        for event in events:
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
            event["pid"] = pid
            out.append(event)
        return self.rewrite_spans(out)

    def rewrite_spans(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pid, clock and ids of the events moved into this rank's spaces, in place: one loop with its
        lookups bound to locals, as it runs for every event written."""
        pids, shift, rank, id_base = self.pids, self.clock.shift_us, self.trace.rank, self.id_base
        # A drifting clock's times are stretched about its pivot, durations with them; most ranks have none.
        rate, pivot = self.clock.drift_ppm * 1e-6, self.clock.pivot_us
        for event in events:
            pid = event.get("pid")
            if pid.__class__ is not int and not isinstance(pid, str | float | None):
                pid = repr(pid)  # a list or object is no process id, but must not stop the merge
            new_pid = pids.get(pid)
            event["pid"] = new_pid if new_pid is not None else self.pid(pid)
            ts = event.get("ts")
            if ts.__class__ is float or ts.__class__ is int:
                event["ts"] = ts + shift
                if rate:
                    event["ts"] += rate * (ts - pivot)
                    dur = event.get("dur")
                    if dur.__class__ is float or dur.__class__ is int:
                        event["dur"] = dur * (1 + rate)
            if "id" in event:
                event["id"] = _new_id(event["id"], rank)
            args = event.get("args")
            if args.__class__ is dict:
                value = args.get("correlation")
                if value is not None:
                    args["correlation"] = id_base + value if value.__class__ is int else _new_id(value, rank)
                value = args.get("External id")
                if value is not None:
                    args["External id"] = id_base + value if value.__class__ is int else _new_id(value, rank)
        self.events += len(events)
        return events

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
    """What pass 2 needs to know about one rank: its clock, what to keep, its cap."""

    clock: RankAlignment  # how its timestamps move onto the merged clock
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
    writer = _RankWriter(tf, job.clock)
    part = _Part(job.cap)
    header: dict[str, Any] = {}
    codes = array("H")
    codes.frombytes(zlib.decompress(job.codes))
    # Each event's fate, decided for the whole rank in one C-level pass over a table of the 1,024 codes
    # (tier * 256 + bucket); per batch, ``compress`` then picks events by these bytes.
    fate = bytes(_MARKER if code >> 8 == MARKER else _DROPPED if code & 255 < job.keep[code >> 8] else _KEPT for code in range(1024))
    fates = bytes(map(fate.__getitem__, codes))
    is_marker, is_kept = fates.translate(_IS_MARKER), fates.translate(_IS_KEPT)
    done, left = 0, job.good_events if job.good_events is not None else len(codes)
    over = 0
    reason = None
    # When the plan drops none of this rank's events, each batch is decoded straight to dicts; otherwise
    # it is split into raw events first, and only the kept ones are decoded.
    decoded = _DROPPED not in fates
    reader = TraceReader(tf.path, Any if decoded else msgspec.Raw, max_batch=_BATCH_BYTES)
    try:
        for kind, key, batch in reader:
            if kind == "key":
                if key in _HEADER_KEYS:
                    header[key] = batch
                continue
            events = batch[: left - done]
            these = slice(done, done + len(events))
            done += len(events)
            markers, spans = list(compress(events, is_marker[these])), list(compress(events, is_kept[these]))
            if not decoded:
                markers, spans = _dicts(markers), _dicts(spans)
            part.add(writer.rewrite_markers(markers), capped=False)
            left_out = part.add(writer.rewrite_spans(spans))
            if left_out:
                over += left_out
                writer.events -= left_out
            if done >= left:
                break
    except (TraceParseError, msgspec.DecodeError, RecursionError) as exc:
        reason = f"damaged after {writer.events} events: {exc}"
    if reason is None and job.damage is not None:
        reason = f"damaged after {writer.events} events: {job.damage}"
    by_kind: Counter[str] = Counter()
    for code, n in sorted(Counter(codes[:done]).items()):
        if fate[code] == _DROPPED:
            by_kind[TIER_NAMES[code >> 8]] += n
    if over:
        by_kind["at the byte cap"] = over
    labels = writer.metadata(truncated=reason is not None)
    return RankPart(
        rank=tf.rank, data=part.finish(), crc=part.crc, raw=part.raw, events=writer.events,
        metadata=msgspec.json.encode(labels)[1:-1], dropped=dict(by_kind), truncated=reason,
        pids={str(k): v for k, v in writer.pids.items()}, header=header,
    )
