"""The device check's checks beyond capture windows (benchmarks/gpu.py): a planted out-of-memory error, and the
analysis of a torch.compile(mode="reduce-overhead") job's first steps (compiling, recording CUDA graphs) and of
its steady state (replaying them)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_driver import Driver, Loop, SmallTransformer

__all__ = ["oom_check", "warm_up_check", "warm_up_failures"]


def oom_check(driver: Driver, loop: Loop) -> dict[str, Any]:
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


class _EagerFirst(nn.Module):
    """Runs ``model`` eagerly for its first ``eager_calls`` calls, then compiled: the driver's lead-in steps before a
    window stay eager, so the window's first step is the compiled model's first call."""

    def __init__(self, model: nn.Module, eager_calls: int, **compile_options: Any) -> None:
        super().__init__()
        self.model, self.eager_calls = model, eager_calls
        self.compiled = torch.compile(model, **compile_options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.eager_calls -= 1
        return self.model(x) if self.eager_calls >= 0 else self.compiled(x)


def warm_up_check(driver: Driver, quick: bool) -> dict[str, Any]:
    """A window over a compiled transformer's first three compiled steps (on CUDA, mode="reduce-overhead": compile,
    then CUDA graph trees' warm-up run and recording), and one 20 steps later (replay): the first window's causes and
    advice, and whether the later one is free of them. On the CPU rehearsal the backend is "eager" (no graphs, no
    device to idle): the same flow, no verdict asked."""
    from orchestrator.analysis import analyze_folder

    cuda = driver.device.type == "cuda"
    ids = torch.randint(0, 1000, (4 if quick else 32, 32 if quick else 128), device=driver.device)
    options: dict[str, Any] = {"mode": "reduce-overhead"} if cuda else {"backend": "eager"}
    model = _EagerFirst(SmallTransformer(dim=64 if quick else 256), eager_calls=2, **options)
    loop = Loop("compiled", model, lambda: (ids, ids), driver.device)
    out: dict[str, Any] = {"options": options}
    for name in ("first_steps", "steady"):
        t0 = time.perf_counter()
        window = driver.window(loop, f"compiled-{name}")
        summary = analyze_folder(driver.store / "gpu" / f"compiled-{name}")
        rank = summary.ranks[0] if summary.ranks else None
        first = summary.findings[0] if summary.findings else None
        out[name] = {
            "state": window["state"], "seconds": time.perf_counter() - t0,
            "step_ms": [round(s.duration_ms, 1) for s in rank.steps] if rank else None,
            "compile_spans": window.get("compile_spans"),
            "idle_causes_ms": {c.cause: c.ms_per_step for c in rank.idle.causes} if rank and rank.idle else None,
            "first_finding": first.code if first else None, "first_severity": first.severity if first else None,
            "first_fix": first.fix if first else None,
        }
        if name == "first_steps":
            driver.train(loop, 20)
    return out


def warm_up_failures(r: dict[str, Any]) -> list[str]:
    """What the CUDA run of :func:`warm_up_check` must show: the first window told warm-up, the later one not."""
    first, steady = r["first_steps"], r["steady"]
    out = [f"compiled {name}: {w['state']}" for name, w in r.items() if name != "options" and w["state"] != "DONE"]
    causes = first["idle_causes_ms"] or {}
    if not {"compile", "capture"} & set(causes):
        out.append(f"compiled first steps: no compile or capture idle time ({causes})")
    if not (first["first_fix"] or "").startswith(("torch.compile compiles while", "The host records CUDA/HIP graphs while")):
        out.append(f"compiled first steps told: {first['first_fix']}")
    if {"compile", "capture"} & set(steady["idle_causes_ms"] or {}):
        out.append(f"compiled steady state still compiles or records: {steady['idle_causes_ms']}")
    return out
