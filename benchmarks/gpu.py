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
- ``verdicts``: ``analyze`` on the fresh traces of a healthy loop and a DataLoader-bound one;
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
import torch.nn.functional as F
from torch import nn

AFTER_TARGET = 1.1
WINDOW_STEPS = 3


class SmallCNN(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        chans = [3, width, width * 2, width * 4]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans, chans[1:]))
        self.norms = nn.ModuleList(nn.BatchNorm2d(b) for b in chans[1:])
        self.head = nn.Linear(chans[-1], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms):
            x = F.max_pool2d(F.relu(norm(conv(x))), 2)
        return self.head(x.mean((2, 3)))


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=dim * 4, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


class Loop:
    """A model, its optimizer and where each step's batch comes from."""

    def __init__(self, name: str, model: nn.Module, batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 device: torch.device) -> None:
        self.name, self.model, self.batch, self.device = name, model.to(device), batch, device
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self) -> None:
        x, y = self.batch()
        out = self.model(x.to(self.device, non_blocking=True))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.to(self.device, non_blocking=True).reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def _loops(device: torch.device, quick: bool) -> dict[str, Loop]:
    side, batch, seq = (32, 8, 32) if quick else (64, 64, 128)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    ids = torch.randint(0, 1000, (batch // 2, seq), device=device)
    # --quick (the CPU rehearsal in the unit tests) makes the transform 4x dearer: at 2x the loader took 29% of a
    # CPU step, a hair over the 25% bar, and a loaded box ran it under.
    loader = _slow_loader(batch, side, scale=4 if quick else 2)
    return {
        "cnn": Loop("cnn", SmallCNN(16 if quick else 64), lambda: (images, labels), device),
        "transformer": Loop("transformer", SmallTransformer(dim=64 if quick else 256), lambda: (ids, ids), device),
        # The same CNN fed by a DataLoader whose per-sample transform runs on the training thread.
        "dataloader_bound": Loop("dataloader_bound", SmallCNN(16 if quick else 64), lambda: next(loader), device),
    }


class _CostlyImages(torch.utils.data.Dataset):
    """Images made by a costly per-sample transform on the CPU (a blur of a ``scale`` x larger image)."""

    def __init__(self, side: int, scale: int) -> None:
        self.side, self.scale = side, scale

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(i)
        img = torch.randn(1, 3, self.side * self.scale, self.side * self.scale, generator=gen)
        return F.avg_pool2d(F.conv2d(img, torch.ones(3, 3, 5, 5) / 75, padding=2), self.scale)[0], i % 10


def _slow_loader(batch: int, side: int, scale: int):
    """A DataLoader as a tutorial's first version has it: the transform on the training thread (num_workers=0)."""
    loader = torch.utils.data.DataLoader(_CostlyImages(side, scale), batch_size=batch, num_workers=0)
    return iter(loader)


class Driver:
    """The real agent, armed and read as the controller would, minus Ray."""

    def __init__(self, store: Path, device: torch.device) -> None:
        from actors.agent.runtime import Agent
        from orchestrator.models.agent_protocol import WorkerInfo

        self.store, self.device = store, device
        self.agent = Agent(WorkerInfo(
            agent_id="gpu-check", target="gpu", world_rank=0, world_size=1, local_rank=0, node_rank=0,
            node_id="n", host=platform.node() or "host", pid=os.getpid(), device=str(device),
            torch_version=torch.__version__,
        ))
        self.boundary_ms: list[float] = []
        self.activities = ["cpu", "cuda"] if device.type == "cuda" else ["cpu"]

    def train(self, loop: Loop, steps: int) -> list[float]:
        """``steps`` steps, each ended by the agent's boundary; returns each step's ms (synchronized)."""
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loop.step()
            b0 = time.perf_counter()
            self.agent.step()
            self.boundary_ms.append((time.perf_counter() - b0) * 1000)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        return times

    def window(self, loop: Loop, profile_id: str, **options: Any) -> dict[str, Any]:
        """Arm one window 2 steps ahead, train through it and its upload; the rank's last event and trace facts."""
        from orchestrator.models.agent_protocol import ArmCommand, StorageSpec, WindowSpec
        from orchestrator.models.requests import TorchOptions

        activities = self.activities
        start = self.agent.step_count + 2
        window = WindowSpec(
            profile_id=profile_id, target="gpu", start_step=start, steps=WINDOW_STEPS, warmup=0,
            options=TorchOptions(activities=activities, **options),
            storage=StorageSpec(uri=str(self.store)), prefix=f"gpu/{profile_id}", max_trace_bytes=2**30,
        )
        self.agent._handle(ArmCommand(window=window))
        capture = self.agent.capture
        assert capture is not None
        self.boundary_ms = []
        for _ in range(WINDOW_STEPS + 10):
            if capture.closed:
                break
            self.train(loop, 1)
        if capture.finisher is not None:
            capture.finisher.join(300)
        events = []
        while not self.agent._inbox.empty():
            events.append(self.agent._inbox.get_nowait()[1])
        last = events[-1]
        facts: dict[str, Any] = {
            "state": last.state.value, "reason": last.reason, "first_step": last.first_step,
            "last_step": last.last_step, "expected_steps": [start, start + WINDOW_STEPS - 1],
            "trace_bytes": last.trace_bytes, "closing_boundary_ms": max(self.boundary_ms, default=0.0),
            "artifacts": {a.kind: a.bytes for a in last.artifacts},
        }
        trace = self.store / "gpu" / profile_id / next((a.key for a in last.artifacts if a.kind == "trace"), "-")
        if trace.is_file():
            with gzip.open(trace, "rt") as f:
                evs = json.load(f).get("traceEvents", [])
            facts["kernels"] = sum(1 for e in evs if e.get("cat") == "kernel")
            # The CPU span only: with CUDA activities each step is also a gpu_user_annotation of the same name.
            facts["profiler_steps"] = sorted(
                int(e["name"].split("#")[1]) for e in evs
                if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
            )
        return facts


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
    first and after the last (twice: a lasting cost shows in both, a passing one in the first only)."""
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


def _oom_check(driver: Driver, loop: Loop) -> dict[str, Any]:
    """Plant an OOM under the agent's OOM watch (its MemoryWatch, recording as a ``memory_history``
    command has it): the snapshot is kept and reported before the job sees the error, then stored
    as a bundle's stacks command would have it stored, and the job trains on."""
    from actors.agent.cuda_memory import TorchAllocator
    from orchestrator.models.agent_protocol import SnapshotDestination, StorageSpec

    watch = driver.agent.memory
    watch._hold_s = 0.5  # nobody stores it while the failing thread waits here: hold it briefly
    reports: list[Any] = []
    watch._report = reports.append
    watch.record(True)
    total = torch.cuda.get_device_properties(0).total_memory
    caught, reported_first, t0 = None, False, time.perf_counter()
    try:
        torch.empty(int(total * 1.5), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        caught, reported_first = type(e).__name__, bool(reports)
    held_ms = (time.perf_counter() - t0) * 1000
    dest = SnapshotDestination(storage=StorageSpec(uri=str(driver.store)), prefix="gpu/oom-bundle")
    artifacts, note = watch.snapshot_to(dest, "OOM check")
    page = (driver.store / "gpu" / "oom-bundle" / "memory" / "rank0.snapshot.html")
    text = page.read_text() if page.is_file() else ""
    watch.record(False)
    driver.train(loop, 2)  # the job trains on
    report = reports[0] if reports else None
    return {
        "exception": caught, "reported_before_exception": reported_first,
        "asked_bytes": report.asked_bytes if report else None, "free_bytes": report.free_bytes if report else None,
        "limit_bytes": report.limit_bytes if report else None, "error_reached_job_after_ms": held_ms,
        "stored": {a.kind: a.bytes for a in artifacts}, "note": note,
        "page_names_the_oom": "Out of memory" in text and "asked for" in text,
        "recording_after": TorchAllocator._recorders, "trains_on": True,
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
    }


def run_check(device: torch.device, quick: bool, work: Path) -> dict[str, Any]:
    """Every check; returns the results (JSON-ready) with ``failures`` naming what missed."""
    torch.manual_seed(0)
    driver = Driver(work / "store", device)
    loops = _loops(device, quick)
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
        section("windows", lambda: {name: _windows_check(driver, loops[name], count, 10 if quick else 100)
                                    for name in ("cnn", "transformer")})
        section("profile_memory", lambda: driver.window(loops["cnn"], "cnn-memory", profile_memory=True))
        if cuda:
            section("memory_snapshot", lambda: {
                "plain": driver.window(loops["transformer"], "tf-plain"),
                "window": driver.window(loops["transformer"], "tf-snapshot", memory_snapshot=True)})
        section("dataloader_window", lambda: (driver.train(loops["dataloader_bound"], 3),
                                              driver.window(loops["dataloader_bound"], "dl-bound"))[1])
        if cuda:
            section("oom", lambda: _oom_check(driver, loops["cnn"]))
    finally:
        restore()
    stderr = (work / "stderr.txt").read_text(errors="replace").splitlines()
    result["cupti_errors"] = [ln for ln in stderr if "cupti" in ln.lower() and ("error" in ln.lower() or "fail" in ln.lower())][:20]
    result["stderr_head"] = stderr[:40]
    section("verdicts", lambda: {"healthy_cnn": _verdict(work / "store", "cnn-w0"),
                                 "healthy_transformer": _verdict(work / "store", "transformer-w0"),
                                 "dataloader_bound": _verdict(work / "store", "dl-bound")})
    section("export_child", lambda: _export_peak(work / "store"))
    section("memory_devices", lambda: _memory_devices(work / "store"))
    result["errors"] = errors
    result["failures"] = _failures(result, cuda)
    return result


def _lasting(device: torch.device, activities: list[str], work: Path, quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    driver = Driver(work / "store", device)
    driver.activities = activities
    windows = _windows_check(driver, _loops(device, quick)["cnn"], 2 if quick else 10, 10 if quick else 100)
    env = {k: v for k, v in os.environ.items() if "CUPTI" in k or "KINETO" in k}
    return {"activities": activities, "env": env, "windows": windows,
            "failures": [f"{len(windows['bad_windows'])} bad windows"] if windows["bad_windows"] else []}


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
    verdicts = r.get("verdicts", {})
    if "dataloader_bound" in verdicts.get("healthy_cnn", {}).get("warnings", []):
        out.append("the healthy CNN was called DataLoader-bound")
    if verdicts and verdicts["dataloader_bound"]["first_finding"] != "dataloader_bound":
        out.append(f"the DataLoader-bound loop's first finding: {verdicts['dataloader_bound']['first_finding']}")
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
    parser.add_argument(
        "--lasting", metavar="ACTIVITIES",
        help="only the CNN's windows with these activities (cpu or cpu,cuda): is a slowdown after the windows "
        "the profiler's lasting cost?",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device here; run it on a GPU machine, or --device cpu", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rayprof-gpu-") as tmp:
        if args.lasting:
            result = _lasting(torch.device(args.device), args.lasting.split(","), Path(tmp), args.quick)
        else:
            result = run_check(torch.device(args.device), args.quick, Path(tmp))
    result["wall_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({"failures": result["failures"], "wall_s": round(result["wall_s"], 1)}))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
