"""Find the rank traces in a folder (or one trace file): rank -> file from each file's header alone.

A rank comes from ``distributedInfo.rank``, else from a ``rank<N>`` token in the
file name. A file that names no rank at all (plain torch.profiler, the
TensorBoard samples) is rank 0 when it is the folder's only trace, else takes
the lowest free rank in file name order, with a note in ``issues``. Traces are
``*.pt.trace.json[.gz]`` (torch.profiler's handler); a folder with none of those is
read for JSON files that open like a Kineto trace (``export_chrome_trace("trace.json")``). A file whose
rank is unreadable, contradicted by its name, or claimed by another file too is
*rejected with a reason*: never replaced silently. Loading a rank is
:mod:`orchestrator.traces.loader`'s job; merge and analysis share this step.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.layout import MERGED_TRACE_NAME, TRACE_SUFFIXES, parse_trace_name, rank_in_name
from orchestrator.models.merge_stats import RejectedTrace
from orchestrator.traces.buffer import READ_ERRORS, open_binary
from orchestrator.traces.stream import TraceParseError, read_header

__all__ = ["RankSource", "RejectedTrace", "TraceFile", "TraceSet", "discover_traces"]

RankSource = Literal["distributedInfo", "file name", "lone file", "file order"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceFile(_Model):
    """One accepted rank trace and what its header says."""

    rank: int
    path: Path
    host: str | None = None
    world_size: int | None = None
    base_time_ns: int = 0
    # Where the rank came from; "lone file" and "file order" mean the trace named none.
    rank_source: RankSource = "distributedInfo"


class TraceSet(_Model):
    """The result of :func:`discover_traces`: accepted files sorted by rank, plus the rest."""

    folder: Path
    """The folder read, or the one trace file given."""
    files: list[TraceFile]
    rejected: list[RejectedTrace]
    issues: list[str]


def _trace_folder(folder: Path) -> Path:
    # A profile folder keeps its traces in traces/; a plain folder holds them directly.
    sub = folder / "traces"
    return sub if sub.is_dir() else folder


# A Kineto trace opens with schemaVersion (torch) or traceEvents within its first bytes, or is an array of events;
# a manifest, a summary or a config is none of these. Only a folder without *.pt.trace.json[.gz] files is read this way.
_SNIFF_BYTES = 65536


def _opens_like_a_trace(path: Path) -> bool:
    try:
        with open_binary(path) as f:
            head = f.read(_SNIFF_BYTES)
    except READ_ERRORS:
        return False
    # Chrome's array format: the file is the events.
    return b'"traceEvents"' in head or b'"schemaVersion"' in head or (head.lstrip().startswith(b"[") and b'"ph"' in head)


def _json_traces(folder: Path) -> tuple[list[Path], int]:
    """The folder's other JSON files that open like a Kineto trace (rayprof's own merged trace aside), and how
    many JSON files were looked at."""
    candidates = sorted(
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")) and p.name != MERGED_TRACE_NAME
    )
    return [p for p in candidates if _opens_like_a_trace(p)], len(candidates)


def _inspect(path: Path) -> TraceFile | RejectedTrace:
    """The file's rank from its header or name; ``rank=-1`` when it names none."""
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
    world_size = info.get("world_size") if isinstance(info, dict) else None
    host = header.get("host_name")
    if not isinstance(host, str):
        parsed = parse_trace_name(path.name)
        host = parsed[1] if parsed else None
    base = header.get("baseTimeNanoseconds", 0)
    if isinstance(base, int) and not isinstance(base, bool) and not 0 <= base < 2**63:
        return RejectedTrace(
            path=path, rank=name_rank, reason=f"baseTimeNanoseconds ({base.bit_length()} bits) is not a time any clock wrote"
        )
    rank, source = (info_rank, "distributedInfo") if info_rank is not None else (name_rank, "file name")
    return TraceFile(
        rank=-1 if rank is None else rank,
        path=path,
        host=host,
        world_size=world_size if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > 0 else None,
        base_time_ns=base if isinstance(base, int) and not isinstance(base, bool) else 0,
        rank_source=source,
    )


def _gaps(present: list[int], world_size: int) -> str:
    """The ranks below ``world_size`` not in ``present`` (sorted), as ranges: ``0-2, 5``. From the ranks
    present, so a 300-rank job missing 299 ranks, or a header claiming 10^12, stays one short line."""
    runs, start = [], 0
    for rank in [*present, world_size]:
        if rank > start:
            runs.append(str(start) if rank - 1 == start else f"{start}-{rank - 1}")
        start = rank + 1
    return ", ".join(runs)


def discover_traces(folder: Path) -> TraceSet:
    """Map ranks to trace files in a profile folder (``traces/``), a plain folder of traces, or one trace file.

    Files are ``*.pt.trace.json`` or ``*.pt.trace.json.gz``; in a folder with none, JSON files that open like a
    Kineto trace. Raises ``FileNotFoundError`` when ``folder`` is neither a folder nor a file; everything else is
    reported in the result.
    """
    folder = Path(folder)
    issues: list[str] = []
    if folder.is_file():
        paths = [folder]
    elif folder.is_dir():
        paths = sorted(p for p in _trace_folder(folder).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        if not paths:
            paths, looked_at = _json_traces(_trace_folder(folder))
            more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            none = f", and none of its {looked_at} .json files opens like a Kineto trace" if looked_at else ""
            issues.append(
                f"read as traces (not named *.pt.trace.json): {', '.join(p.name for p in paths[:5])}{more}"
                if paths
                else f"no *.pt.trace.json[.gz] files in {_trace_folder(folder)}{none}"
            )
    else:
        raise FileNotFoundError(f"no such file or folder: {folder}")
    by_rank: dict[int, list[TraceFile]] = defaultdict(list)
    rejected: list[RejectedTrace] = []
    unranked: list[TraceFile] = []
    for path in paths:
        result = _inspect(path)
        if isinstance(result, RejectedTrace):
            rejected.append(result)
        elif result.rank < 0:
            unranked.append(result)
        else:
            by_rank[result.rank].append(result)
    if len(unranked) == 1 and not by_rank:
        by_rank[0].append(unranked[0].model_copy(update={"rank": 0, "rank_source": "lone file"}))
    elif unranked:
        free = (n for n in range(len(by_rank) + len(unranked)) if n not in by_rank)
        for tf in unranked:
            rank = next(free)
            by_rank[rank].append(tf.model_copy(update={"rank": rank, "rank_source": "file order"}))
            issues.append(f"{tf.path.name} names no rank: taken as rank {rank} by file name order")
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
    sizes = {tf.rank: tf.world_size for tf in files if tf.world_size is not None}
    if len(set(sizes.values())) > 1:
        issues.append(f"ranks disagree on world_size: {sizes}")
    elif sizes:
        world_size = next(iter(sizes.values()))
        # From the ranks present, never from range(world_size): a header may claim any number.
        present = sorted(tf.rank for tf in files if tf.rank < world_size)
        if len(present) < world_size:
            issues.append(f"no usable trace for rank(s) [{_gaps(present, world_size)}] of world_size {world_size}")
    return TraceSet(folder=folder, files=files, rejected=rejected, issues=issues)
