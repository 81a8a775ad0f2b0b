"""Manifest and merge at scale: 64 ranks with realistic traces.

Seed: one real trace exported by a short SmallResNet window
(``benchmarks.window.run_window``, default options, ~1-2 MB raw). It is
replicated to every rank with ``distributedInfo.rank``/``world_size`` set,
``baseTimeNanoseconds`` shifted a little per rank and every duration jittered
a few percent, then gzipped like an agent does, into a profile folder laid out
as DESIGN.md says, next to each rank's op table and memory timeline.

Measured, each in a fresh child process so its peak RSS is its own:

* ``write_manifest`` on ``FileStorage`` for 64 ranks x 3 artifacts (building
  the ``Manifest`` model included: the controller does both),
* ``merge_traces`` of the 64 rank traces into one ``merged.trace.json.gz``.

Peak memory is the child's peak RSS (``VmHWM``) minus its RSS after imports, and
separately Python's own ``tracemalloc`` peak in one extra (slower) run.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import LogFn
from benchmarks._stats import REPO, Result

NAME = "scale"
TARGET = "bench-scale"
PROFILE_ID = "prof-bench-scale"


def make_seed(dest: Path, steps: int, log: LogFn) -> tuple[Path, Path]:
    """A real trace (gz) and op table from one SmallResNet window."""
    import torch

    from benchmarks.window import Trainer, run_window

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer()
        for _ in range(5):
            trainer.step()
        store = dest / "seed-store"
        seed = dest / "seed.pt.trace.json.gz"
        run = run_window(trainer, store, "default", steps=steps, idle_steps=5, keep_trace_to=seed)
    finally:
        torch.set_num_threads(threads)
    ops = next(store.rglob("*.key_averages.csv"))
    shutil.copyfile(ops, dest / "seed.ops.csv")
    shutil.rmtree(store, ignore_errors=True)
    log(f"{NAME}: seed trace {run.trace_raw_bytes / 1e6:.2f} MB raw, {seed.stat().st_size / 1e3:.0f} kB gz, "
        f"{steps} steps")
    return seed, dest / "seed.ops.csv"


def build_profile(root: Path, ranks: int, seed: Path, ops: Path, log: LogFn) -> dict[str, Any]:
    """Write ``ranks`` perturbed copies of the seed plus op tables and memory timelines.

    Returns the manifest skeleton (per-rank artifact descriptions) as JSON-able data.
    """
    from orchestrator.layout import profile_prefix, rank_artifact_keys
    from orchestrator.storage import FileStorage

    with gzip.open(seed, "rt", encoding="utf-8") as f:
        text = f.read()
    base = json.loads(text)
    prefix = profile_prefix(TARGET, PROFILE_ID)
    files = FileStorage(root).scoped(prefix)
    rng = random.Random(0)
    work = root.parent / "gen"
    work.mkdir(parents=True, exist_ok=True)
    ranks_out = []
    t0 = time.perf_counter()
    for r in range(ranks):
        trace = json.loads(text)  # a fresh copy; the C decoder beats deepcopy by far
        trace["distributedInfo"] = {"backend": "gloo", "rank": r, "world_size": ranks}
        trace["baseTimeNanoseconds"] = int(base.get("baseTimeNanoseconds", 0)) + rng.randint(0, 2_000_000)
        for ev in trace["traceEvents"]:
            # Jitter durations a few percent, so ranks differ as real ones do.
            if isinstance(ev.get("dur"), (int, float)):
                ev["dur"] = round(ev["dur"] * (0.97 + 0.06 * rng.random()), 3)
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                ev.setdefault("args", {})["name"] = f"python {4000 + r}"
        host = f"node{r // 8}"
        pid = 4000 + r
        keys = rank_artifact_keys(r, host, pid)
        local = work / f"rank{r}.json.gz"
        with gzip.open(local, "wt", encoding="utf-8", compresslevel=6) as f:
            json.dump(trace, f)
        mem = work / f"rank{r}.mem.json.gz"
        with gzip.open(mem, "wt", encoding="utf-8") as f:
            json.dump({"base_time_ns": trace["baseTimeNanoseconds"], "devices": {}}, f)
        arts = [
            files.put_file(local, keys["trace"], "trace"),
            files.put_file(mem, keys["memory_timeline"], "memory_timeline"),
            files.put_file(ops, keys["op_table"], "op_table"),
        ]
        local.unlink()
        mem.unlink()
        ranks_out.append({"rank": r, "host": host, "pid": pid, "artifacts": [a.model_dump() for a in arts],
                          "base_time_ns": trace["baseTimeNanoseconds"]})
    shutil.rmtree(work, ignore_errors=True)
    raw_total = sum((root / prefix / a["key"]).stat().st_size for x in ranks_out for a in x["artifacts"]
                    if a["kind"] == "trace")
    log(f"{NAME}: wrote {ranks} ranks ({raw_total / 1e6:.1f} MB of gz traces) in {time.perf_counter() - t0:.1f}s")
    return {"root": str(root), "ranks": ranks_out}


# ---- child processes: one measurement each, reported as JSON on stdout ----

def _status_bytes(field: str) -> int:
    # VmHWM (peak RSS) belongs to this process image: ru_maxrss would carry the
    # parent's peak over fork+exec, and the parent has torch loaded.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _child(kind: str, spec_path: str, traced: bool) -> None:
    import tracemalloc

    from orchestrator.manifest import write_manifest
    from orchestrator.models.profile import Artifact, Manifest, RankResult
    from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
    from orchestrator.storage import FileStorage
    from orchestrator.traces.discover import discover_traces
    from orchestrator.traces.merge import merge_traces

    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    folder = root / TARGET / PROFILE_ID
    baseline = _status_bytes("VmRSS")
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if kind == "manifest":
        from orchestrator.models.common import utcnow

        now = utcnow()
        storage = FileStorage(root)
        manifest = Manifest(
            profile_id=PROFILE_ID, target=TARGET, status=ProfileState.DONE,
            request=ProfileRequest(target=TARGET, steps=5), storage_uri=f"{storage.root_uri}/{TARGET}/{PROFILE_ID}",
            start_step=100, stop_step=105, cluster={"world_size": len(spec["ranks"])},
            ranks=[
                RankResult(rank=x["rank"], host=x["host"], pid=x["pid"], state=RankState.DONE, first_step=100,
                           last_step=104, step_durations_ms=[20.0] * 5, base_time_ns=x["base_time_ns"],
                           artifacts=[Artifact(**a) for a in x["artifacts"]], armed_at=now,
                           capture_started_at=now, capture_ended_at=now, finished_at=now)
                for x in spec["ranks"]
            ],
            requested_at=now, finished_at=now,
        )
        write_manifest(storage, manifest)
        info["manifest_bytes"] = (folder / "manifest.json").stat().st_size
    else:
        out = folder / "merged.trace.json.gz"
        stats = merge_traces(discover_traces(folder), out)
        info.update(events=stats.events, input_bytes=stats.input_bytes, output_bytes=stats.output_bytes,
                    ranks=len(stats.ranks), skipped=len(stats.skipped))
    seconds = time.perf_counter() - t0
    if traced:
        info["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    info.update(seconds=seconds, baseline_rss=baseline, peak_rss=_status_bytes("VmHWM"))
    print("RESULT " + json.dumps(info))


def _measure(kind: str, spec_path: Path, traced: bool = False, timeout: float = 300.0) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--child", kind, str(spec_path)] + (["--traced"] if traced else []),
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{kind} child failed (rc {proc.returncode}): {proc.stderr[-2000:]}")


def run(quick: bool, log: LogFn) -> list[Result]:
    """Manifest write and merge for 64 ranks (16 with --quick)."""
    ranks, seed_steps, trials = (8, 3, 1) if quick else (64, 10, 3)
    tmp = Path(tempfile.mkdtemp(prefix="rayprof-bench-scale-"))
    results: list[Result] = []
    try:
        seed, ops = make_seed(tmp, seed_steps, log)
        with gzip.open(seed, "rb") as f:
            seed_raw = len(f.read())
        spec = build_profile(tmp / "store", ranks, seed, ops, log)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec))
        man: list[dict[str, Any]] = []
        mer: list[dict[str, Any]] = []
        for t in range(trials):
            # Alternate so both see the same background load.
            man.append(_measure("manifest", spec_path))
            (tmp / "store" / TARGET / PROFILE_ID / "merged.trace.json.gz").unlink(missing_ok=True)
            mer.append(_measure("merge", spec_path))
            log(f"{NAME}: trial {t + 1}/{trials}: manifest {man[-1]['seconds'] * 1e3:.0f} ms, "
                f"merge {mer[-1]['seconds']:.1f}s ({mer[-1]['events']:,} events), "
                f"peak RSS {mer[-1]['peak_rss'] / 2**20:.0f} MiB")
        man_tm = _measure("manifest", spec_path, traced=True)
        (tmp / "store" / TARGET / PROFILE_ID / "merged.trace.json.gz").unlink(missing_ok=True)
        mer_tm = _measure("merge", spec_path, traced=True)
        m0 = mer[0]
        bench = f"{NAME}[{ranks} ranks]"
        note_seed = (f"seed: real SmallResNet trace, {seed_steps} steps, {seed_raw / 1e6:.2f} MB raw / "
                     f"{seed.stat().st_size / 1e3:.0f} kB gz per rank; {m0['input_bytes'] / 1e6:.1f} MB gz in, "
                     f"{m0['events']:,} events, {m0['output_bytes'] / 1e6:.1f} MB out")
        results += [
            Result.of(bench, f"write_manifest ({ranks} x 3 artifacts) time", "ms",
                      [m["seconds"] * 1e3 for m in man],
                      note=f"manifest.json {man[0]['manifest_bytes'] / 1e3:.0f} kB; Manifest model build + "
                      "existence check of every artifact + atomic write"),
            Result.of(bench, "write_manifest peak RSS over baseline", "MiB",
                      [(m["peak_rss"] - m["baseline_rss"]) / 2**20 for m in man]),
            Result(bench, "write_manifest tracemalloc peak", "MiB", man_tm["tracemalloc_peak"] / 2**20, n=1),
            Result.of(bench, "merge_traces time", "s", [m["seconds"] for m in mer], note=note_seed),
            Result.of(bench, "merge_traces throughput (raw JSON in)", "MB/s",
                      [ranks * seed_raw / 1e6 / m["seconds"] for m in mer]),
            Result.of(bench, "merge_traces peak RSS over baseline", "MiB",
                      [(m["peak_rss"] - m["baseline_rss"]) / 2**20 for m in mer],
                      note="child process VmHWM minus its RSS after imports"),
            Result(bench, "merge_traces tracemalloc peak", "MiB", mer_tm["tracemalloc_peak"] / 2**20, n=1,
                   note="Python allocations only, one extra run under tracemalloc"),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    # Child mode: python -m benchmarks.scale --child {manifest|merge} SPEC [--traced]
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], "--traced" in sys.argv[4:])
    else:
        sys.exit("run the benchmarks with: python -m benchmarks scale")
