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
2. **Write** (:func:`~orchestrator.traces.merge_write.write_rank`): each rank's kept events, rewritten, as its
   own deflate stream ended by a sync flush. Such streams concatenate into one
   valid deflate stream, so the caller writes one ordinary single-member gzip
   file from the ranks' parts without recompressing anything.

What the merged trace keeps apart and lines up:

* **Processes.** Rank R's processes get pids ``(R + 1) * PID_STRIDE + k`` (never
  0, which viewers treat as the idle task), named ``rank R (host)`` for the one
  with ``ProfilerStep#`` spans and ``rank R (host) <original name>`` for the rest.
* **Clocks.** Every rank is put on the earliest ``baseTimeNanoseconds``, then,
  where ranks share collectives, shifted (and its drift undone) by a line fitted
  to the differences of their end times (see :func:`~orchestrator.traces.clocks.align`);
  each rank's shift, drift and error bound are in :attr:`MergeStats.alignment`,
  and :attr:`MergeStats.alignment_note` says which ranks stand on wall clocks only.
* **Ids.** Flow and async ``id``, ``args.correlation`` and ``args["External id"]``
  become ``rank * 2**40 + id`` (strings ``"r<rank>:<id>"``), so links never cross ranks.

A rank whose file is damaged mid-way keeps the events before the damage and is
reported in ``truncated`` and labelled ``[truncated]``. The output is written
under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from orchestrator.config import max_merged_bytes
from orchestrator.models.merge_stats import DroppedEvents, MergeStats, RankAlignment, RejectedTrace
from orchestrator.traces.clocks import align, wall_clock_note
from orchestrator.traces.discover import TraceFile, TraceSet, discover_traces
from orchestrator.traces.fanout import RankMap, serial
from orchestrator.traces.gzjoin import GzipFile
from orchestrator.traces.merge_plan import RankScan, bucket_floor_us, plan, scan_ranks
from orchestrator.traces.merge_write import ID_STRIDE, PID_STRIDE, WriteJob, write_rank
from orchestrator.traces.stream import TraceParseError, read_header

__all__ = ["ID_STRIDE", "PID_STRIDE", "DroppedEvents", "MergeStats", "RankAlignment", "merge_folder", "merge_traces"]


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
    :func:`~orchestrator.analysis.front.analyze_for_merge`'s read of the same files)
    spares those ranks the scan; the others are scanned here.
    """
    started = time.perf_counter()
    if max_bytes is None:
        max_bytes = max_merged_bytes()
    files, skipped = _as_trace_files(traces)
    files.sort(key=lambda tf: tf.rank)
    rank_scans = scan_ranks(files, rank_map, scans)
    alignment = align(rank_scans, min((tf.base_time_ns for tf in files), default=0))
    # Room for each rank's process labels and header in the trailer.
    the_plan = plan(rank_scans, max_bytes, cap=max_bytes - (32 << 10) * (len(files) + 2))
    jobs = [
        WriteJob(a, the_plan.keep, s.codes, the_plan.caps[tf.rank], s.good_events, s.reason)
        for tf, s, a in zip(files, rank_scans, alignment)
    ]
    out = Path(out)
    # Created exclusively under a random name: a planted link cannot redirect the write.
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    tmp = Path(name)
    truncated: list[RejectedTrace] = []
    ranks_info: list[dict[str, Any]] = []
    device_properties: list[dict[str, Any]] = []
    labels: list[bytes] = []
    dropped: Counter[str] = Counter()
    events = 0
    try:
        gz = GzipFile(os.fdopen(fd, "wb"))
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
        alignment_note=wall_clock_note(alignment),
    )


def merge_folder(folder: Path, out: Path, *, max_bytes: int | None = None, rank_map: RankMap = serial) -> MergeStats:
    """Discover the rank traces in ``folder`` (see :func:`discover_traces`) and merge them into ``out``."""
    return merge_traces(discover_traces(Path(folder)), out, max_bytes=max_bytes, rank_map=rank_map)
