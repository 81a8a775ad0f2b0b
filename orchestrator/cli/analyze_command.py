"""``rayprof analyze PATH``: a folder of traces (or one trace file) analysed on this machine, its report and merged
trace written (``rayprof report`` on a downloaded profile ends here too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.cli.output import emit_json, print_analysis
from orchestrator.errors import EXIT_FAILED, EXIT_OK, InvalidRequestError, StorageError
from orchestrator.manifest import read_folder_manifest

__all__ = ["analyze", "analyze_dir"]


def analyze_dir(path: Path, args: argparse.Namespace, *, write: bool = True) -> int:
    """Analyse a folder of traces or one trace file; when ``write``, also merge them into ``merged.trace.json.gz`` and
    write ``report.html`` (into ``--out`` where given, else the folder, or the file's folder). A folder that cannot be
    written to keeps the analysis: it is printed, and what could not be written is said with the way round it."""
    from orchestrator.analysis.front import analyze_folder, analyze_for_merge
    from orchestrator.analysis.memory_chart import load_timelines, render_memory_section
    from orchestrator.analysis.report import write_report
    from orchestrator.layout import MERGED_TRACE_NAME
    from orchestrator.traces.discover import discover_traces
    from orchestrator.traces.fanout import process_pool
    from orchestrator.traces.merge import merge_traces

    if not path.exists():
        raise InvalidRequestError(f"{path}: no such file or folder")
    # One file is one rank: no profile folder around it (its manifest, memory timelines) belongs to it.
    folder, whole = (path, True) if path.is_dir() else (path.parent, False)
    out_dir = Path(args.out) if getattr(args, "out", None) else folder
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidRequestError(f"--out {out_dir} is not a folder")
    merge, report, unwritten = None, None, None
    # Ranks are analysed one per core, as the controller fans them out over the cluster.
    with process_pool() as rank_map:
        if write:
            # As the controller does: one read per rank for its summary and the merge's scan, so the
            # alignment of any folder (each rank's clock shift and residual) can be checked without a cluster.
            traces = discover_traces(path)
            summary, scans = analyze_for_merge(traces, rank_map=rank_map)
            if summary.ranks:
                try:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    merge = merge_traces(traces, out_dir / MERGED_TRACE_NAME, rank_map=rank_map, scans=scans)
                except OSError as e:
                    unwritten = e
        else:
            summary = analyze_folder(path, rank_map=rank_map)
    manifest = read_folder_manifest(folder) if whole else None
    memory = render_memory_section(*load_timelines(folder)) if whole else ""
    if write and summary.ranks and unwritten is None:
        try:
            report = write_report(summary, out_dir / "report.html", manifest, memory, profile_folder=folder)
        except OSError as e:
            unwritten = e
    if args.json:
        emit_json({"summary": summary, "report": report, "merge": merge})
    else:
        print_analysis(summary, report if report is not None else _existing_report(folder) if whole else None, manifest)
        if merge is not None:
            aligned = ", ".join(
                f"rank {a.rank} {a.shift_us:+.1f} µs" + (f" {a.drift_ppm:+.0f} ppm" if a.drift_ppm else "")
                + (f" (±{a.residual_us:.1f})" if a.residual_us is not None else "")
                for a in merge.alignment
            )
            print(f"merged: {out_dir / MERGED_TRACE_NAME}" + (f"; clock shifts: {aligned}" if aligned else ""))
    if not summary.ranks:
        print(f"rayprof: no usable traces in {path}", file=sys.stderr)
        return EXIT_FAILED
    if unwritten is not None:
        print(
            f"rayprof: {StorageError.code}: the analysis stands, but report.html and the merged trace could not be written "
            f"into {out_dir} ({unwritten.strerror or unwritten}): pass --out DIR to write them elsewhere",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _existing_report(folder: Path) -> Path | None:
    path = folder / "report.html"
    return path if path.is_file() else None


def analyze(args: argparse.Namespace) -> int:
    return analyze_dir(Path(args.dir), args)
