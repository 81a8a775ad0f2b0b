"""The device check: the agent's CUDA capture path on a real GPU, without Ray.

    python -m benchmarks.gpu --out benchmarks/results/gpu-h100.json     # on a CUDA machine, < 8 min
    python -m benchmarks.gpu --device cpu --quick --out /tmp/gpu.json   # the same flow on CPU (tests/unit/test_gpu_check.py)

It needs torch and rayprof's small dependencies only (pydantic, msgspec, isal: ``make
device-wheels`` downloads them for Python 3.12), never Ray: the real :class:`Agent` is
driven as a fake controller would drive it (its ``arm`` command handled, its events read
from its inbox), and every step boundary is the agent's own ``step()``.

Checks, each recorded with its numbers in the JSON it writes:
- ``windows``: 10 windows in a row per model (a small CNN, a small transformer), CPU + CUDA
  activities: every window DONE on exactly its steps, kernels in every trace, no CUPTI error on
  stderr, and the step time after the windows within 1.1x of before;
- ``profile_memory``: the memory timeline has a CUDA device;
- ``memory_snapshot``: one window's allocator snapshot and its page, and what taking it costs
  the closing boundary;
- ``oom``: a planted out-of-memory error: the observer's snapshot is written before the
  exception reaches the job, holds the ``oom`` event, and training goes on;
- ``warm_up``: a torch.compile(mode="reduce-overhead") transformer's first compiled steps are told warm-up
  (compiling, recording CUDA graphs), and 20 steps later no step compiles or records;
- ``verdicts``: ``analyze`` on the fresh traces of a healthy loop, a DataLoader-bound one, and one that runs a
  Python loop on the training thread each step (the device idle finding names its function from the agent's stack
  samples, with no with_stack; on CPU the host_python finding does), and the CNN left under anomaly detection (told,
  with its step time beside the plain CNN's: what turning it off saves, against the finding's figure), and a
  16-layer transformer keeping a weights' average through AveragedModel(avg_fn=...) (told param_loop; no other
  loop is);
- ``export_peak_rss``: the export children's peak memory and the largest raw trace.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_checks import oom_check, warm_up_check, warm_up_failures
from benchmarks.gpu_driver import Driver, Loop, loops

AFTER_TARGET = 1.1


def _stderr_to(path: Path):
    """Send fd 2 (where Kineto and CUPTI write) to ``path``; returns the restore function."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)

    return restore


def _windows_check(driver: Driver, loop: Loop, count: int, steps_timed: int) -> dict[str, Any]:
    """``count`` windows in a row, and the step time before them (twice: the A/A spread), after the
    first and after the last (twice: a lasting cost shows in both, a passing one in the first only); whose cost a
    slowdown is, benchmarks/gpu_lasting.py measures."""
    driver.train(loop, 10)  # warm: cuDNN autotuning, the allocator's first segments
    med = lambda: statistics.median(driver.train(loop, steps_timed))  # noqa: E731
    before, before_again = med(), med()
    windows = [driver.window(loop, f"{loop.name}-w0")]
    after_first = med()
    windows += [driver.window(loop, f"{loop.name}-w{i}") for i in range(1, count)]
    after, after_again = med(), med()
    ratio = after / before
    kernels_expected = "cuda" in driver.activities
    bad = [w for w in windows if w["state"] != "DONE" or w.get("profiler_steps") != list(
        range(w["expected_steps"][0], w["expected_steps"][1] + 1)) or (kernels_expected and not w.get("kernels"))]
    return {
        "windows": len(windows), "bad_windows": bad, "kernels_per_window": [w.get("kernels") for w in windows],
        "step_ms_before": before, "step_ms_before_again": before_again, "step_ms_after_first_window": after_first,
        "step_ms_after": after, "step_ms_after_again": after_again,
        "a_a": before_again / before, "after_over_before": ratio, "after_again_over_before": after_again / before,
        "after_met": ratio <= AFTER_TARGET,
        "closing_boundary_ms": statistics.median(w["closing_boundary_ms"] for w in windows),
        "largest_trace_bytes": max(w["trace_bytes"] or 0 for w in windows),
    }


def _verdict(store: Path, profile_id: str) -> dict[str, Any]:
    from orchestrator.analysis import analyze_folder

    summary = analyze_folder(store / "gpu" / profile_id)
    warnings = [f for f in summary.findings if f.severity == "warning"]
    first = summary.findings[0] if summary.findings else None
    return {
        "first_finding": first.code if first else None, "first_title": first.title if first else None,
        "first_fix": first.fix if first else None, "warnings": [f.code for f in warnings],
        "findings": [f.code for f in summary.findings],
        "savings_ms": {f.code: f.max_saving_ms for f in summary.findings},
    }


def run_check(device: torch.device, quick: bool, work: Path) -> dict[str, Any]:
    """Every check; returns the results (JSON-ready) with ``failures`` naming what missed."""
    torch.manual_seed(0)
    driver = Driver(work / "store", device)
    models = loops(device, quick)
    count = 2 if quick else 10
    cuda = device.type == "cuda"
    result: dict[str, Any] = {"machine": {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "host_cpus": os.cpu_count(),
    }, "quick": quick}
    errors: list[str] = []

    def section(name: str, fn: Callable[[], Any]) -> None:
        # One check's crash is recorded and the others still run: a device run is too dear to lose whole.
        try:
            result[name] = fn()
        except Exception as e:
            errors.append(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")

    restore = _stderr_to(work / "stderr.txt")
    try:
        section("windows", lambda: {name: _windows_check(driver, models[name], count, 10 if quick else 100)
                                    for name in ("cnn", "transformer")})
        section("profile_memory", lambda: driver.window(models["cnn"], "cnn-memory", profile_memory=True))
        if cuda:
            section("memory_snapshot", lambda: {
                "plain": driver.window(models["transformer"], "tf-plain"),
                "window": driver.window(models["transformer"], "tf-snapshot", memory_snapshot=True)})
        section("dataloader_window", lambda: (driver.train(models["dataloader_bound"], 3),
                                              driver.window(models["dataloader_bound"], "dl-bound"))[1])
        section("python_window", lambda: driver.window(models["python_bound"], "py-bound"))
        section("anomaly_window", lambda: _anomaly(driver, models, 10 if quick else 50))
        section("ema_window", lambda: (driver.train(models["ema"], 3), driver.window(models["ema"], "ema"))[1])
        if "generation" in models:
            section("generation_window", lambda: (driver.train(models["generation"], 2),
                                                  driver.window(models["generation"], "generation"))[1])
        if cuda:
            section("oom", lambda: oom_check(driver, models["cnn"]))
        section("warm_up", lambda: warm_up_check(driver, quick))
    finally:
        restore()
    stderr = (work / "stderr.txt").read_text(errors="replace").splitlines()
    result["cupti_errors"] = [ln for ln in stderr if "cupti" in ln.lower() and ("error" in ln.lower() or "fail" in ln.lower())][:20]
    result["stderr_head"] = stderr[:40]
    section("verdicts", lambda: {"healthy_cnn": _verdict(work / "store", "cnn-w0"),
                                 "healthy_transformer": _verdict(work / "store", "transformer-w0"),
                                 "dataloader_bound": _verdict(work / "store", "dl-bound"),
                                 "python_bound": _verdict(work / "store", "py-bound"),
                                 "anomaly": _verdict(work / "store", "anomaly"),
                                 "ema": _verdict(work / "store", "ema"),
                                 **({"generation": _verdict(work / "store", "generation")} if "generation" in models else {})})
    result["skipped"] = [] if "generation" in models else ["generation: transformers is not installed here"]
    section("export_child", lambda: _export_peak(work / "store"))
    section("memory_devices", lambda: _memory_devices(work / "store"))
    result["errors"] = errors
    result["failures"] = _failures(result, cuda)
    return result


def _anomaly(driver: Driver, models: dict[str, Loop], steps: int) -> dict[str, Any]:
    """The CNN under anomaly detection: one window, and its step time beside the plain CNN's, alternated (the
    difference is what turning it off saves)."""
    plain, anomaly = models["cnn"], models["anomaly"]
    driver.train(anomaly, 3)
    window = driver.window(anomaly, "anomaly")
    plain_ms, anomaly_ms = [], []
    for _ in range(2):
        plain_ms += driver.train(plain, steps)
        anomaly_ms += driver.train(anomaly, steps)
    return {**window, "plain_step_ms": statistics.median(plain_ms), "anomaly_step_ms": statistics.median(anomaly_ms)}


def _export_peak(store: Path) -> dict[str, Any]:
    """The export child's own peak RSS on the largest trace of this run (its raw JSON again)."""
    from benchmarks.export import run_child

    largest = max(store.glob("gpu/*/traces/*.pt.trace.json.gz"), key=lambda p: p.stat().st_size)
    raw = store / "largest.raw.json"
    with gzip.open(largest, "rb") as src, open(raw, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    out = store / "largest-export"
    out.mkdir()
    peak, seconds, _ = run_child(raw, out)
    return {"trace": largest.parent.parent.name, "raw_bytes": raw.stat().st_size, "peak_rss_mib": peak / 2**20,
            "seconds": seconds}


def _failures(r: dict[str, Any], cuda: bool) -> list[str]:
    out = [e.splitlines()[0] for e in r["errors"]]
    for name, w in r.get("windows", {}).items():
        if w["bad_windows"]:
            out.append(f"{name}: {len(w['bad_windows'])} windows not DONE on their steps (or without kernels)")
        if cuda and not w["after_met"]:
            out.append(f"{name}: steps after the windows {w['after_over_before']:.3f}x of before (target {AFTER_TARGET}x)")
    if r["cupti_errors"]:
        out.append(f"{len(r['cupti_errors'])} CUPTI error lines on stderr")
    if "profile_memory" in r and "memory_timeline" not in r["profile_memory"]["artifacts"]:
        out.append("profile_memory window: no memory timeline")
    if cuda and not any(d.startswith("cuda") for d in r.get("memory_devices", [])):
        out.append(f"profile_memory: the memory timeline has no CUDA device ({r.get('memory_devices')})")
    if cuda and "memory_snapshot" in r:
        snap = r["memory_snapshot"]["window"]
        if snap["state"] != "DONE" or not {"memory_snapshot", "memory_view"} <= set(snap["artifacts"]):
            out.append(f"memory_snapshot window: {snap['state']} {snap['reason']}")
    if cuda and "oom" in r:
        oom = r["oom"]
        if not (oom["exception"] and oom["reported_before_exception"] and oom["page_names_the_oom"]
                and {"memory_snapshot", "memory_view"} <= set(oom["stored"])):
            out.append(f"planted OOM: {oom}")
    if cuda and "warm_up" in r:
        out += warm_up_failures(r["warm_up"])
    verdicts = r.get("verdicts", {})
    if "dataloader_bound" in verdicts.get("healthy_cnn", {}).get("warnings", []):
        out.append("the healthy CNN was called DataLoader-bound")
    if verdicts and verdicts["dataloader_bound"]["first_finding"] != "dataloader_bound":
        out.append(f"the DataLoader-bound loop's first finding: {verdicts['dataloader_bound']['first_finding']}")
    anomaly = verdicts.get("anomaly")
    # A warning on a GPU, where each check waits for the queued kernels; on CPU told at all: its floor there is 10-33%
    # of the step by the samples' luck, too near the 8% bar for a check that runs beside other work.
    if anomaly and "anomaly_mode" not in (anomaly["warnings"] if cuda else anomaly["findings"]):
        out.append(f"the loop under anomaly detection: no anomaly_mode {'warning' if cuda else 'finding'} ({anomaly['findings']})")
    if any("anomaly_mode" in v["findings"] for k, v in verdicts.items() if k != "anomaly"):
        out.append("a loop without anomaly detection was told it is on")
    ema = verdicts.get("ema")
    if ema and "param_loop" not in ema["findings"]:
        out.append(f"the loop keeping a weights' average one tensor at a time: no param_loop finding ({ema['findings']})")
    if any("param_loop" in v["findings"] for k, v in verdicts.items() if k != "ema"):
        out.append("a loop with no average of its weights was told one")
    generation = verdicts.get("generation")
    if generation and generation["first_finding"] != "generation":
        out.append(f"the loop generating in its step: {generation['first_finding']} first, not generation")
    if any("generation" in v["findings"] for k, v in verdicts.items() if k != "generation"):
        out.append("a loop that generates nothing was told it does")
    python = verdicts.get("python_bound")
    expected = "low_gpu_utilization" if cuda else "host_python"
    if python and (python["first_finding"] != expected or "_score_labels" not in (python["first_fix"] or "")):
        out.append(f"the Python-bound loop: {python['first_finding']} ({python['first_fix']}), not {expected} naming _score_labels")
    return out


def _memory_devices(store: Path) -> list[str]:
    path = store / "gpu" / "cnn-memory" / "memory" / "rank0.memory_timeline.json.gz"
    with gzip.open(path, "rt") as f:
        return sorted(json.load(f)["devices"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="2 windows per model, small models")
    # A device run is too dear to lose its traces: kept, they become test data read later on CPU.
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the profiles under DIR and keep them")
    args = parser.parse_args(argv)
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: the folder is not empty")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device here; run it on a GPU machine, or --device cpu", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rayprof-gpu-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run_check(torch.device(args.device), args.quick, work)
    result["wall_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({"failures": result["failures"], "wall_s": round(result["wall_s"], 1)}))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
