"""The merge's first pass and its budget: what each rank would cost, how clocks line up, what fits.

:func:`scan_rank` reads one rank (typed, args left undecoded) into a small
:class:`RankScan`: the bytes each kind of event would take, by duration, and
the end times of its collectives. It runs once per rank, in parallel where a
fan-out is given (see :mod:`orchestrator.traces.fanout`); :func:`align` and
:func:`plan` join the scans of all ranks in the caller.

Kinds of events, most kept first (``tier``): metadata and ``ProfilerStep#``
markers; collectives and copies; other spans (ops, kernels, runtime calls);
flows, instants and counters. Over budget, a tier is kept down to the
duration that fills what is left of it.
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from orchestrator import settings
from orchestrator.models.merge_stats import DroppedEvents, MergeStats, RankAlignment
from orchestrator.traces.categories import HOST_COLLECTIVE_PREFIXES, starts_copy
from orchestrator.traces.discover import TraceFile
from orchestrator.traces.fanout import RankMap
from orchestrator.traces.gcpause import gc_paused
from orchestrator.traces.loader import TIME_RANGE_US, canonical_category
from orchestrator.traces.stream import TraceParseError, TraceReader

__all__ = [
    "DroppedEvents", "MergePlan", "MergeStats", "RankAlignment", "RankScan", "RankScanner", "ScanEvent",
    "bucket_floor_us", "classify", "new_metadata", "plan", "scan_rank", "scan_ranks",
]

MARKER, COMM, SPAN, OTHER = range(4)
TIER_NAMES = ("markers", "collectives and copies", "ops and kernels", "flows, instants and counters")
_PROCESS_METADATA = frozenset({"process_name", "process_labels", "process_sort_index"})
_HOST_COMM_PREFIXES = (*HOST_COLLECTIVE_PREFIXES, "record_param_comms")
_POINT_TO_POINT = ("gloo:send", "gloo:recv")
_MAX_COLLECTIVES = 4096  # per rank: plenty for a median, bounded memory
_SAFETY = 0.95  # the estimate runs above the written size; this covers the rest


class ScanEvent(msgspec.Struct):
    """The fields both passes read; ``args`` stays raw bytes (its length is the size estimate)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw()


def bucket_floor_us(b: int) -> float:
    """The shortest duration in bucket ``b`` (0: keep everything; 256: nothing)."""
    if b <= 0:
        return -math.inf
    return math.inf if b >= 256 else 2 ** ((b - 40) / 4)


def classify(ph: str, raw_cat: str, name: str) -> tuple[int, bool, bool]:
    """(tier, whether it is a collective that ends together on every rank, whether it is a device event).

    NCCL's (and oneCCL's) kernels and gloo's worker-thread ops end together on all ranks;
    ``c10d::``, ``nccl:`` and ``record_param_comms`` host ops only enqueue the
    work, so their ends drift and are not used to align clocks. Neither are gloo's
    sends and receives: one ends with its peer's opposite op alone, and the k-th
    send of one rank is not the k-th of another (a pipeline's first stage sends
    activations, its last sends gradients back: on one host they read 3.7 ms apart).
    """
    cat = canonical_category(raw_cat)
    if ph == "M" or (ph == "X" and name.startswith("ProfilerStep#")):
        return MARKER, False, False
    if ph != "X":
        return OTHER, False, False
    device_comm = cat == "kernel" and ("nccl" in (low := name.lower()) or low.startswith("oneccl_"))
    if device_comm or name.startswith(_HOST_COMM_PREFIXES):
        together = device_comm or (name.startswith("gloo:") and not name.startswith(_POINT_TO_POINT))
        return COMM, together, cat == "kernel"
    if cat == "gpu_memcpy" or starts_copy(cat, name):
        return COMM, False, False
    return SPAN, False, False


def new_metadata(seen: set[tuple[Any, Any, Any]], name: Any, pid: Any, tid: Any) -> bool:
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


# Per (ph, cat, name): tier * 256, the bytes an event takes besides its args, whether it is a collective
# that ends together on every rank, whether it is a device event, whether it is metadata.
_Class = tuple[int, int, bool, bool, bool]


def _class_of(ph: str, cat: str, name: str) -> _Class:
    tier, together, device = classify(ph, cat, name)
    return tier * 256, 90 + len(cat) + len(name), together, device, tier == MARKER and ph == "M"


@dataclass
class RankScan:
    """Pass 1 over one rank: byte estimates by tier and duration, collective end times, damage."""

    rank: int
    base_time_ns: int
    histogram: list[int] = field(default_factory=lambda: [0] * (4 * 256))  # tier * 256 + bucket
    ends: dict[bool, dict[str, list[float]]] = field(default_factory=lambda: {True: {}, False: {}})
    # Each event's tier * 256 + duration bucket, in file order (uint16, zlib-compressed: a few KB per rank),
    # so the write pass decides what to keep without decoding the events' fields again.
    codes: bytes = b""
    good_events: int | None = None  # events before damage, when damaged
    reason: str | None = None
    raw_bytes: int = 0
    file_bytes: int = 0  # as stored (gzipped); measured where the rank is read, which may be another node

    def tier(self, tier: int) -> list[int]:
        return self.histogram[tier * 256 : (tier + 1) * 256]


class RankScanner:
    """Builds one rank's :class:`RankScan` from its event batches, in file order.

    Fed by :func:`scan_rank`'s own read, or by the analysis's read of the same
    file (:func:`~orchestrator.traces.loader.load_rank`'s ``on_batch``), so a
    rank that is analysed and merged is decoded once for both.
    """

    def __init__(self, tf: TraceFile) -> None:
        self.path = tf.path
        self.out = RankScan(rank=tf.rank, base_time_ns=tf.base_time_ns)
        self.ends: dict[bool, defaultdict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
        self.collectives = self.seen = 0
        self.classes: dict[tuple[str, str, str], _Class] = {}
        self.metadata: set[tuple[Any, Any, Any]] = set()
        self.codes = array("H")

    def add(self, batch: list[Any]) -> None:
        """Count a batch of events (anything with ScanEvent's fields); raises TraceParseError at a time no clock wrote."""
        histogram, log2, append, classes, ends = self.out.histogram, math.log2, self.codes.append, self.classes, self.ends
        low, high = -TIME_RANGE_US, TIME_RANGE_US
        for e in batch:
            ts, dur = e.ts, e.dur
            if ts is not None and not low < ts + dur < high:
                self.seen += next(i for i, x in enumerate(batch) if x is e)
                raise TraceParseError(f"event {self.seen}: time {ts + dur:g} µs is beyond what any clock writes")
            key = (e.ph, e.cat, e.name)
            found = classes.get(key)
            if found is None:
                found = classes[key] = _class_of(*key)
            base, size, together, device, metadata = found
            # Quarter-octave duration bucket, 0 for <= 2**-10 µs, 255 for >= 2**53.75 µs (inlined: once per event).
            b = 0 if dur <= 0.001 else int(4 * log2(dur)) + 40
            code = base + (b if b < 255 else 255)
            append(code)
            if metadata and not new_metadata(self.metadata, e.name, e.pid, e.tid):
                continue
            histogram[code] += size + len(e.args)
            if together and ts is not None and self.collectives < _MAX_COLLECTIVES:
                ends[device][e.name].append(ts + dur)
                self.collectives += 1
        self.seen += len(batch)

    def finish(self, raw_bytes: int, damage: TraceParseError | None = None) -> RankScan:
        """The scan, given the JSON bytes read and the damage that ended the read early, if any."""
        out = self.out
        if damage is not None:
            out.good_events, out.reason = self.seen, str(damage)
        out.raw_bytes = raw_bytes
        # Measured after the read: a file that cannot be opened is the reader's error to report first.
        out.file_bytes = self.path.stat().st_size
        out.codes = zlib.compress(self.codes.tobytes(), 1)
        # Files are not in time order across threads; the k-th of a name is the k-th in time.
        out.ends = {device: {name: sorted(v) for name, v in by_name.items()} for device, by_name in self.ends.items()}
        return out


@gc_paused
def scan_rank(tf: TraceFile, _: Any = None) -> RankScan:
    """Read one rank once, for the merge alone; a damaged file keeps what came before the damage."""
    scanner = RankScanner(tf)
    reader = TraceReader(tf.path, ScanEvent)
    damage = None
    try:
        for kind, _, batch in reader:
            if kind == "events":
                scanner.add(batch)
    except TraceParseError as exc:
        damage = exc
    return scanner.finish(reader.bytes_read, damage)


def scan_ranks(files: list[TraceFile], rank_map: RankMap, given: Mapping[int, RankScan] | None = None) -> list[RankScan]:
    """Pass 1 for each of ``files``, in order: the scans ``given`` (rank -> scan, from the analysis's
    read of the same files), the other ranks scanned through ``rank_map``."""
    scans = dict(given or {})
    missing = [tf for tf in files if tf.rank not in scans]
    if missing:
        scans.update(zip((tf.rank for tf in missing), rank_map(scan_rank, [(tf, None) for tf in missing], "scanning")))
    return [scans[tf.rank] for tf in files]


def _threshold(histogram: list[int], room: float) -> int:
    """The lowest bucket such that it and every longer one fit in ``room`` bytes (256: none fit)."""
    used = 0
    for b in range(255, -1, -1):
        used += histogram[b]
        if used > room:
            return b + 1
    return 0


@dataclass(frozen=True)
class MergePlan:
    """Min duration bucket per tier (0: all, 256: none), each rank's byte cap, and why anything is left out."""

    keep: tuple[int, int, int, int]
    caps: dict[int, int]
    why: str | None


def plan(scans: list[RankScan], max_bytes: int, cap: int) -> MergePlan:
    """What fits ``max_bytes``; ``cap`` (the hard limit on events written) is shared by the ranks'
    estimated kept bytes, so a rank whose estimate ran low cannot starve the ranks after it."""
    merged = [[sum(col) for col in zip(*(s.tier(t) for s in scans))] or [0] * 256 for t in range(4)]
    totals = [sum(h) for h in merged]
    keep, why = (0, 0, 0, 0), None
    if sum(totals) > max_bytes * _SAFETY:
        room = max_bytes * _SAFETY - totals[MARKER]
        comm = _threshold(merged[COMM], room)
        keep = (0, comm, _threshold(merged[SPAN], room - totals[COMM]) if comm == 0 else 256, 256)
        why = (
            f"about {sum(totals) / 2**20:.0f} MiB of events is over the {max_bytes / 2**20:.0f} MiB budget "
            f"({settings.MAX_MERGED_BYTES_ENV_VAR}): kept step markers, collectives, copies and the longest ops and kernels"
        )
    kept = {s.rank: sum(sum(s.tier(t)[keep[t]:]) for t in (COMM, SPAN, OTHER)) for s in scans}
    total = sum(kept.values()) or 1
    return MergePlan(keep=keep, caps={rank: int(cap * k / total) for rank, k in kept.items()}, why=why)
