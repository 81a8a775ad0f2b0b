"""Find rank traces in a folder and load one rank's trace into compact, typed form.

Two steps, kept apart so that merge and analysis can share the first:

* :func:`discover_traces` maps rank -> file from each file's header alone. A
  rank comes from ``distributedInfo.rank``, else from a ``rank<N>`` token in
  the file name. A file whose rank is missing, unreadable, contradicted by its
  name, or claimed by another file too is *rejected with a reason*: never
  replaced silently, never turned into rank 0.
* :func:`load_rank` streams one file and keeps only what the analysis needs
  (spans of a few categories, memory peaks), so one rank is in memory at a time.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.layout import TRACE_SUFFIXES, parse_trace_name, rank_in_name
from orchestrator.traces.stream import TraceParseError, iter_trace, read_header

__all__ = [
    "RankTrace",
    "RejectedTrace",
    "Span",
    "TraceFile",
    "TraceSet",
    "discover_traces",
    "load_rank",
]


# Span categories the analysis reads; anything else (flows, instants, python
# stacks) is skipped at load time to keep a rank's footprint small.
_KEPT_CATEGORIES = frozenset(
    {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceFile(_Model):
    """One accepted rank trace and what its header says."""

    rank: int
    path: Path
    host: str | None = None
    world_size: int | None = None
    base_time_ns: int = 0


class RejectedTrace(_Model):
    """A file that could not stand for a rank, and why."""

    path: Path
    rank: int | None = None
    reason: str


class TraceSet(_Model):
    """The result of :func:`discover_traces`: accepted files sorted by rank, plus the rest."""

    folder: Path
    files: list[TraceFile]
    rejected: list[RejectedTrace]
    issues: list[str]


def _trace_folder(folder: Path) -> Path:
    # A profile folder keeps its traces in traces/; a plain folder holds them directly.
    sub = folder / "traces"
    return sub if sub.is_dir() else folder


def _inspect(path: Path) -> TraceFile | RejectedTrace:
    name_rank = rank_in_name(path.name)
    try:
        header = read_header(path)
    except TraceParseError as exc:
        return RejectedTrace(path=path, rank=name_rank, reason=f"unreadable trace: {exc}")
    info = header.get("distributedInfo")
    info_rank = info.get("rank") if isinstance(info, dict) else None
    if info_rank is not None and (not isinstance(info_rank, int) or isinstance(info_rank, bool) or info_rank < 0):
        return RejectedTrace(path=path, rank=name_rank, reason=f"distributedInfo.rank is not a rank: {info_rank!r}")
    if info_rank is not None and name_rank is not None and info_rank != name_rank:
        return RejectedTrace(
            path=path, rank=info_rank, reason=f"file name says rank {name_rank} but distributedInfo says rank {info_rank}"
        )
    rank = info_rank if info_rank is not None else name_rank
    if rank is None:
        return RejectedTrace(path=path, reason="no rank: the trace has no distributedInfo and its name has no rank<N>")
    world_size = info.get("world_size") if isinstance(info, dict) else None
    host = header.get("host_name")
    if not isinstance(host, str):
        parsed = parse_trace_name(path.name)
        host = parsed[1] if parsed else None
    base = header.get("baseTimeNanoseconds", 0)
    return TraceFile(
        rank=rank,
        path=path,
        host=host,
        world_size=world_size if isinstance(world_size, int) else None,
        base_time_ns=base if isinstance(base, int) else 0,
    )


def discover_traces(folder: Path) -> TraceSet:
    """Map ranks to trace files in a profile folder (``traces/``) or a plain folder of traces.

    Files are ``*.pt.trace.json`` or ``*.pt.trace.json.gz``. Raises
    ``FileNotFoundError`` when the folder does not exist; everything else is
    reported in the result.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder: {folder}")
    paths = sorted(p for p in _trace_folder(folder).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    by_rank: dict[int, list[TraceFile]] = defaultdict(list)
    rejected: list[RejectedTrace] = []
    for path in paths:
        result = _inspect(path)
        if isinstance(result, RejectedTrace):
            rejected.append(result)
        else:
            by_rank[result.rank].append(result)
    files: list[TraceFile] = []
    for rank in sorted(by_rank):
        claimants = by_rank[rank]
        if len(claimants) == 1:
            files.append(claimants[0])
            continue
        # Which one is right cannot be known from the files: keep neither.
        names = ", ".join(tf.path.name for tf in claimants)
        for tf in claimants:
            rejected.append(RejectedTrace(path=tf.path, rank=rank, reason=f"duplicate rank {rank}: claimed by {names}"))
    issues: list[str] = []
    sizes = {tf.rank: tf.world_size for tf in files if tf.world_size is not None}
    if len(set(sizes.values())) > 1:
        issues.append(f"ranks disagree on world_size: {sizes}")
    elif sizes:
        world_size = next(iter(sizes.values()))
        missing = sorted(set(range(world_size)) - {tf.rank for tf in files})
        if missing:
            issues.append(f"no usable trace for rank(s) {missing} of world_size {world_size}")
    if not paths:
        issues.append(f"no *.pt.trace.json[.gz] files in {_trace_folder(folder)}")
    return TraceSet(folder=folder, files=files, rejected=rejected, issues=issues)


@dataclass(slots=True, frozen=True)
class Span:
    """A complete ("X") event, in µs on the trace's own clock (relative to its base time)."""

    ts: float
    end: float
    name: str
    cat: str
    pid: Any
    tid: Any
    correlation: int | None = None
    args: dict[str, Any] | None = None


@dataclass(slots=True)
class RankTrace:
    """One rank's trace reduced to what the analysis reads."""

    file: TraceFile
    spans: list[Span] = field(default_factory=list)
    # (device type, device id) -> peak "Total Allocated" bytes seen in [memory] events.
    memory_peaks: dict[tuple[int, int], int] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)


def _keep(event: dict[str, Any]) -> bool:
    cat = event.get("cat")
    if cat in _KEPT_CATEGORIES:
        return True
    # Module and DataLoader spans, when recorded with with_modules / with_stack.
    name = event.get("name", "")
    return cat == "python_function" and (name.startswith("nn.Module:") or "_next_data" in name)


def load_rank(trace: TraceFile) -> RankTrace:
    """Stream one rank's trace and keep spans, memory peaks and device properties.

    Raises :class:`~orchestrator.traces.stream.TraceParseError` when the file
    is damaged anywhere: a truncated trace would silently understate the
    last steps, so the analysis rejects it instead.
    """
    out = RankTrace(file=trace)
    names: dict[str, str] = {}
    for kind, key, value in iter_trace(trace.path):
        if kind == "key":
            if key == "deviceProperties" and isinstance(value, list):
                out.device_properties = [d for d in value if isinstance(d, dict)]
            continue
        ph = value.get("ph")
        if ph == "X" and _keep(value):
            ts, dur = value.get("ts"), value.get("dur", 0)
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                continue
            name = value.get("name", "")
            args = value.get("args") or {}
            cat = value["cat"]
            # Many spans share a few names: intern them to keep a big rank small.
            name = names.setdefault(name, sys.intern(name) if isinstance(name, str) else str(name))
            copy_args = {k: args[k] for k in ("bytes",) if k in args} if cat == "gpu_memcpy" else None
            out.spans.append(
                Span(ts, ts + dur, name, cat, value.get("pid"), value.get("tid"), args.get("correlation"), copy_args)
            )
        elif ph == "i" and value.get("name") == "[memory]":
            args = value.get("args") or {}
            allocated = args.get("Total Allocated")
            if isinstance(allocated, int):
                device = (int(args.get("Device Type", 0)), int(args.get("Device Id", -1)))
                if allocated > out.memory_peaks.get(device, -1):
                    out.memory_peaks[device] = allocated
    out.spans.sort(key=lambda s: (s.ts, -s.end))
    return out
