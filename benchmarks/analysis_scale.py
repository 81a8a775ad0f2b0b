"""Analysis and merge at real size, side by side with Holistic Trace Analysis (HTA) on the same folders.

Folders (built in a temp dir, deleted after), from the real traces in
``../shared/external-traces`` re-ranked (``distributedInfo.rank``/``world_size``
rewritten in place, every other byte kept) and gzipped as an agent writes them:

* ``64 ranks``: HTA's A100 traces ``nccl_parser`` (9.8 MB raw, rank 0 of 2) and
  ``negative_queue`` (25.8 MB, rank 0 of 16) alternated over 64 ranks: ~1.14 GB raw.
* ``8 ranks``: eight copies of ``trace_diff_control`` (A100, 34.8 MB): the 279 MB
  folder issue 11 measured (rayprof 61 s / 67 MiB, HTA 24 s / 521 MiB).
* ``--quick``: eight ranks of ``nccl_parser`` (78 MB), to stay under two minutes.

Each tool runs in a fresh child process, rayprof three times and HTA twice,
interleaved (rayprof, HTA, rayprof, HTA, rayprof), and the rows give medians:
a single pair on this noisy machine moved the time ratio from 0.17x to 0.21x
between two back-to-back runs of the same code.

* rayprof: what the controller's postprocessing runs: ``analyze_for_merge``
  (one read per rank for its summary and the merge's scan) then
  ``merge_traces`` (default 256 MiB budget), their per-rank work in one worker
  process per core: the functions the controller runs as Ray tasks, without
  the Ray runtime's own memory.
* HTA: ``TraceAnalysis(trace_dir=...)`` (which parses in a pool of up to one
  process per core) then ``get_temporal_breakdown()``.

Peak memory is the largest summed RSS of the child and its children, sampled
every 50 ms (HTA's parser pool is in the children), and never less than the
child's own ``VmHWM``. HTA gets a time limit on the 64-rank folder; when it
does not finish, the row says so and the ratio comes from the 8-rank folder.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks import LogFn
from benchmarks._stats import REPO, Result

NAME = "analysis_scale"
EXTERNAL = REPO.parent / "shared" / "external-traces"
_SOURCES = {
    "nccl_parser": EXTERNAL / "hta_nccl_parser_a100_r0of2" / "traces" / "nccl_data.pt.trace.json.gz",
    "negative_queue": EXTERNAL / "hta_negative_queue_a100_r0of16" / "traces" / "rank0.pt.trace.json.gz",
    "control": EXTERNAL / "hta_trace_diff_control_a100_r3of8" / "traces" / "control.pt.trace.json.gz",
}
TARGET_SECONDS = 60.0
TARGET_RSS_MIB = 1024.0
TARGET_RATIO = 0.2
_SAMPLE_S = 0.05
# rayprof runs per folder, with HTA run between each two (one fewer): ~9 s and ~50 s a run on the 64-rank folder.
RAYPROF_TRIALS = 3
WORKERS = os.cpu_count() or 1


def _reranked(source: bytes, rank: int, world_size: int) -> bytes:
    """The trace with its ``distributedInfo`` replaced; the events are untouched."""
    head = source[: 1 << 20].decode("utf-8", errors="replace")
    key = head.index('"distributedInfo"')
    start = head.index("{", key)
    _, end = json.JSONDecoder().raw_decode(head, start)
    info = {"backend": "nccl", "rank": rank, "world_size": world_size}
    prefix = head[:start].encode()
    return prefix + json.dumps(info).encode() + source[len(head[:end].encode()) :]


def build_folder(folder: Path, sources: list[str], ranks: int, log: LogFn) -> int:
    """Write ``ranks`` gzipped traces cycling over ``sources``; returns their raw bytes."""
    folder.mkdir(parents=True)
    texts = {}
    for name in sources:
        with gzip.open(_SOURCES[name], "rb") as f:
            texts[name] = f.read()
    total = 0
    for rank in range(ranks):
        data = _reranked(texts[sources[rank % len(sources)]], rank, ranks)
        with gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "wb", compresslevel=1) as f:
            f.write(data)
        total += len(data)
    log(f"{NAME}: {ranks} ranks of {'+'.join(sources)}: {total / 1e9:.2f} GB raw, "
        f"{sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.0f} MB gz")
    return total


def _child(kind: str, folder: str) -> None:
    folder_path = Path(folder)
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if kind == "rayprof":
        from orchestrator.analysis import analyze_for_merge
        from orchestrator.traces.discover import discover_traces
        from orchestrator.traces.fanout import process_pool
        from orchestrator.traces.merge import merge_traces

        # One worker per core: the per-rank work the controller runs as Ray tasks, here in local processes.
        with process_pool(WORKERS) as rank_map, tempfile.TemporaryDirectory() as out:
            traces = discover_traces(folder_path)
            summary, scans = analyze_for_merge(traces, rank_map=rank_map)
            info["analyze_s"] = time.perf_counter() - t0
            info["ranks"] = len(summary.ranks)
            info["rejected"] = [r.reason for r in summary.rejected][:3]
            t1 = time.perf_counter()
            stats = merge_traces(traces, Path(out) / "merged.trace.json.gz", rank_map=rank_map, scans=scans)
            info["merge_s"] = time.perf_counter() - t1
        info.update(
            merged_raw_bytes=stats.output_raw_bytes, merged_gz_bytes=stats.output_bytes,
            dropped=stats.dropped.events if stats.dropped else 0, merged_events=stats.events,
        )
    else:
        import logging

        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis

        analysis = TraceAnalysis(trace_dir=str(folder_path))
        info["load_s"] = time.perf_counter() - t0
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        info["ranks"] = len(breakdown)
    info["seconds"] = time.perf_counter() - t0
    # CPU time of this process and its (joined) pool workers: what the wall time would be on one idle core,
    # and the figure to compare when other work shares the machine.
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    info["cpu_s"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    with open("/proc/self/status") as f:
        info["vmhwm"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps(info), flush=True)


def measure(kind: str, folder: Path, timeout: float) -> dict[str, Any] | None:
    """Run one tool on ``folder`` in a child; None when it ran past ``timeout`` (then it is killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.analysis_scale", "--child", kind, str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    peak = 0
    started = time.monotonic()
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        if time.monotonic() - started > timeout:
            for p in [*parent.children(recursive=True), parent]:
                p.kill()
            proc.communicate()
            return None
        try:
            tree = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree))
        except psutil.Error:
            pass  # a pool worker exited between listing and reading
        time.sleep(_SAMPLE_S)
    out, err = proc.communicate()
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["peak_rss"] = max(peak, result["vmhwm"])
            return result
    raise RuntimeError(f"{kind} child failed (rc {proc.returncode}): {err[-2000:]}")


def _trials(label: str, folder: Path, raw: int, hta_timeout: float, log: LogFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """rayprof, HTA, rayprof, HTA, rayprof: interleaved, so a busy spell on the machine hits both tools,
    and the medians are compared. HTA is not run again once it ran past ``hta_timeout`` (``hta`` then
    has fewer runs than the turns it was given)."""
    ours: list[dict[str, Any]] = []
    hta: list[dict[str, Any]] = []
    for turn in range(2 * RAYPROF_TRIALS - 1):
        if turn % 2 == 0:
            result = measure("rayprof", folder, timeout=1800)
            assert result is not None
            ours.append(result)
            log(f"{NAME}[{label}]: rayprof {result['seconds']:.1f}s (analyze {result['analyze_s']:.1f}s, "
                f"merge {result['merge_s']:.1f}s), {raw / 1e6 / result['seconds']:.0f} MB/s, "
                f"peak RSS {result['peak_rss'] / 2**20:.0f} MiB")
        elif len(hta) == turn // 2:
            result = measure("hta", folder, timeout=hta_timeout)
            if result is None:
                log(f"{NAME}[{label}]: HTA did not finish within {hta_timeout:.0f}s")
                continue
            hta.append(result)
            log(f"{NAME}[{label}]: HTA {result['seconds']:.1f}s (load {result['load_s']:.1f}s), "
                f"peak RSS {result['peak_rss'] / 2**20:.0f} MiB")
    return ours, hta


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _rows(label: str, raw: int, ours: list[dict[str, Any]], hta: list[dict[str, Any]], hta_timeout: float, targets: bool) -> list[Result]:
    bench = f"{NAME}[{label}]"
    seconds, mib = _median(ours, "seconds"), _median(ours, "peak_rss") / 2**20
    last = ours[-1]
    rows = [
        Result.of(bench, "rayprof analyze+merge wall time", "s", [r["seconds"] for r in ours],
                  target=f"< {TARGET_SECONDS:.0f} s" if targets else "",
                  met=seconds < TARGET_SECONDS if targets else None,
                  note=f"{raw / 1e9:.2f} GB raw, {last['ranks']} ranks analysed; analyze "
                  f"{_median(ours, 'analyze_s'):.1f}s + merge {_median(ours, 'merge_s'):.1f}s (medians); merged "
                  f"{last['merged_raw_bytes'] / 2**20:.0f} MiB raw ({last['merged_gz_bytes'] / 1e6:.0f} MB gz), "
                  f"{last['dropped']:,} events left out for the budget"),
        Result.of(bench, "rayprof throughput (raw JSON in, analyze+merge)", "MB/s", [raw / 1e6 / r["seconds"] for r in ours]),
        Result.of(bench, "rayprof CPU time (process tree)", "s", [r["cpu_s"] for r in ours], note=f"{WORKERS} worker processes"),
        Result.of(bench, "rayprof peak RSS", "MiB", [r["peak_rss"] / 2**20 for r in ours],
                  target=f"< {TARGET_RSS_MIB:.0f} MiB" if targets else "", met=mib < TARGET_RSS_MIB if targets else None),
    ]
    if not hta:
        rows.append(Result(bench, "HTA load + temporal breakdown", "s", None, note=f"did not finish within {hta_timeout:.0f}s"))
        return rows
    hta_seconds, hta_mib = _median(hta, "seconds"), _median(hta, "peak_rss") / 2**20
    rows += [
        Result.of(bench, "HTA load + temporal breakdown wall time", "s", [r["seconds"] for r in hta],
                  note=f"load {_median(hta, 'load_s'):.1f}s (median)"),
        Result.of(bench, "HTA peak RSS (process tree)", "MiB", [r["peak_rss"] / 2**20 for r in hta]),
        Result.of(bench, "HTA CPU time (process tree)", "s", [r["cpu_s"] for r in hta]),
        Result(bench, "time ratio rayprof / HTA", "x", seconds / hta_seconds, n=len(ours),
               target=f"<= {TARGET_RATIO}", met=seconds / hta_seconds <= TARGET_RATIO,
               note=f"medians of {len(ours)} and {len(hta)} interleaved runs"),
        Result(bench, "memory ratio rayprof / HTA", "x", mib / hta_mib, n=len(ours),
               target=f"<= {TARGET_RATIO}", met=mib / hta_mib <= TARGET_RATIO),
    ]
    return rows


def run(quick: bool, log: LogFn) -> list[Result]:
    """rayprof vs HTA: 8 ranks of nccl_parser with --quick; else 64 ranks (>= 1 GB) and the issue's 8-rank folder."""
    missing = [str(p) for p in _SOURCES.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"external traces missing: {missing}")
    tmp = Path(tempfile.mkdtemp(prefix="rayprof-bench-analysis-"))
    results: list[Result] = []
    try:
        plans = [("8 ranks nccl_parser", ["nccl_parser"], 8, 120.0, False)] if quick else [
            ("64 ranks", ["nccl_parser", "negative_queue"], 64, 900.0, True),
            ("8 ranks control (issue 11)", ["control"], 8, 600.0, False),
        ]
        for label, sources, ranks, hta_timeout, targets in plans:
            folder = tmp / label.replace(" ", "_")
            raw = build_folder(folder, sources, ranks, log)
            ours, hta = _trials(label, folder, raw, hta_timeout, log)
            results += _rows(label, raw, ours, hta, hta_timeout, targets)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    # Child mode: python -m benchmarks.analysis_scale --child {rayprof|hta} FOLDER
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
    else:
        sys.exit("run the benchmarks with: python -m benchmarks analysis_scale")
