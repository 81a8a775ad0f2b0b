"""STOPGAP until the rewritten loader (issue 11, item 1) lands in orchestrator/traces.

The loader of record refuses a trace without a rank and drops PyTorch 1.8/1.9
categories and MTIA's, so the analysis could not be tested on those real
traces. This module is the smallest bridge: it accepts a file without a rank
(the only file: rank 0; several unranked files and no ranked one: by name
order, with a note) and loads spans
with old category names aliased (:func:`legacy_category_alias`). When the new
loader lands, :mod:`orchestrator.analysis` should call its discover/load
functions directly and this file should be deleted.
"""

from __future__ import annotations

import sys

from orchestrator.analysis.spans import DEVICE_CATEGORIES, HOST_CATEGORIES
from orchestrator.traces.loader import RankTrace, Span, TraceFile, TraceSet, discover_traces
from orchestrator.traces.stream import iter_trace, read_header

__all__ = ["discover_any", "legacy_category_alias", "load_any"]

_LEGACY = {"Operator": "cpu_op", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime"}
_KEPT = DEVICE_CATEGORIES | HOST_CATEGORIES | {"gpu_user_annotation"}


def legacy_category_alias(cat: object) -> object:
    """PyTorch 1.8/1.9 category names (``Operator``, ``Kernel``...) as today's Kineto writes them."""
    return _LEGACY.get(cat, cat) if isinstance(cat, str) else cat


def discover_any(folder) -> TraceSet:
    """:func:`discover_traces`, plus a folder of files without a rank: a lone file is rank 0, several go by name order."""
    found = discover_traces(folder)
    unranked = [r for r in found.rejected if r.rank is None and r.reason.startswith("no rank")]
    if not unranked or found.files:
        # Beside ranked files an unranked one is ambiguous: it stays rejected.
        return found
    files: list[TraceFile] = []
    issues = list(found.issues)
    for rank, rejected in enumerate(sorted(unranked, key=lambda r: r.path.name)):
        header = read_header(rejected.path)
        base = header.get("baseTimeNanoseconds", 0)
        files.append(TraceFile(rank=rank, path=rejected.path, base_time_ns=base if isinstance(base, int) else 0))
        if len(unranked) > 1:
            issues.append(f"{rejected.path.name} names no rank: taken as rank {rank} by file name order")
    return found.model_copy(
        update={
            "files": files,
            "rejected": [r for r in found.rejected if r not in unranked],
            "issues": issues,
        }
    )


def load_any(trace: TraceFile) -> RankTrace:
    """Like :func:`orchestrator.traces.loader.load_rank`, keeping legacy and MTIA categories."""
    out = RankTrace(file=trace)
    names: dict[str, str] = {}
    for kind, key, value in iter_trace(trace.path):
        if kind == "key":
            if key == "deviceProperties" and isinstance(value, list):
                out.device_properties = [d for d in value if isinstance(d, dict)]
            continue
        ph = value.get("ph")
        cat = legacy_category_alias(value.get("cat"))
        name = value.get("name", "")
        keep = cat in _KEPT and (cat != "python_function" or name.startswith("nn.Module:") or "_next_data" in name)
        if ph == "X" and keep:
            ts, dur = value.get("ts"), value.get("dur", 0)
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                continue
            args = value.get("args") or {}
            name = names.setdefault(name, sys.intern(name) if isinstance(name, str) else str(name))
            copy_args = {k: args[k] for k in ("bytes",) if k in args} if cat == "gpu_memcpy" else None
            out.spans.append(Span(ts, ts + dur, name, cat, value.get("pid"), value.get("tid"), args.get("correlation"), copy_args))
        elif ph == "i" and name == "[memory]":
            args = value.get("args") or {}
            allocated = args.get("Total Allocated")
            if isinstance(allocated, int):
                device = (int(args.get("Device Type", 0)), int(args.get("Device Id", -1)))
                if allocated > out.memory_peaks.get(device, -1):
                    out.memory_peaks[device] = allocated
    out.spans.sort(key=lambda s: (s.ts, -s.end))
    return out
