"""The controller's telemetry at idle: 1,024 simulated ranks, metrics and history on vs off.

One real controller actor per run, 1,024 simulated ranks polling through one
relay per 8-rank node (:mod:`benchmarks.sim_host`, 100 ms steps, default
``poll_timeout_s`` = 10 s). Runs alternate off, on, off, on, ... (a fresh
controller each), so drift on a shared machine falls on both sides. Per run:
the controller's CPU over the idle window and its RSS at the end
(``/proc`` of its pid), and its gauge recorder's (the small actor that sets
the gauges it sends, :mod:`actors.controller.monitoring.recorder`). With
telemetry on, every heartbeat goes into the history and every rank's gauges
are computed on the monitor tick (1 s) and sent when they change.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from benchmarks import LogFn
from benchmarks._stats import Result, ensure_ray, proc_cpu_seconds, proc_rss_bytes
from benchmarks.control_plane import HOSTS, RANKS_PER_NODE, STEP_TIME_S, _controller_pid, _kill_controller
from benchmarks.sim_host import SimHost, sum_counters

NAME = "telemetry"
RANKS = 1024


def _one_run(on: bool, n: int, idle_s: float, store: Path, log: LogFn) -> dict[str, float]:
    from actors.controller.actor import create_controller
    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec

    _kill_controller()
    config = controller_config(StorageSpec(uri=str(store / f"{'on' if on else 'off'}-{time.time_ns()}")))
    config = config.model_copy(update={"metrics": on, "history": on})
    handle = create_controller(config)
    ray.get(handle.ping.remote(), timeout=60)
    pid = _controller_pid(handle)
    target = f"sim-tel-{n}"
    block = -(-n // HOSTS)
    per_host = [list(range(h * block, min(n, (h + 1) * block))) for h in range(HOSTS)]
    hosts = [
        SimHost.remote(target, ranks, n, h, STEP_TIME_S, RANKS_PER_NODE, config.poll_timeout_s, time.monotonic())
        for h, ranks in enumerate(per_host)
    ]
    try:
        ray.get([h.start.remote(config.poll_timeout_s) for h in hosts], timeout=300)
        deadline = time.monotonic() + config.poll_timeout_s + 60
        while sum_counters(hosts)["outstanding_polls"] < n and time.monotonic() < deadline:
            time.sleep(0.5)
        # Past one poll timeout every rank has heartbeat: the history holds every rank.
        time.sleep(config.poll_timeout_s + 2)
        recorder = _recorder_pid(handle)
        c0, r0, w0 = proc_cpu_seconds(pid), proc_cpu_seconds(recorder) if recorder else 0.0, time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - w0
        cpu = 100 * (proc_cpu_seconds(pid) - c0) / elapsed
        recorder_cpu = 100 * (proc_cpu_seconds(recorder) - r0) / elapsed if recorder else 0.0
        rss = proc_rss_bytes(pid)
        recorder_rss = proc_rss_bytes(recorder) if recorder else 0
        log(
            f"{NAME}: telemetry {'on ' if on else 'off'}: idle cpu {cpu:.1f}% (+ gauge recorder {recorder_cpu:.1f}%), "
            f"rss {rss / 2**20:.0f} MiB (+ {recorder_rss / 2**20:.0f} MiB)"
        )
        return {"cpu_pct": cpu, "recorder_cpu_pct": recorder_cpu, "rss": rss, "recorder_rss": recorder_rss}
    finally:
        try:
            ray.get([h.stop.remote() for h in hosts], timeout=30)
        except Exception:
            pass
        for h in hosts:
            ray.kill(h)
        _kill_controller()


def _recorder_pid(handle: Any) -> int | None:
    """The pid of the controller's gauge recorder actor; None when it runs none (metrics off)."""

    def actor(controller: Any) -> Any:
        metrics = controller._telemetry._metrics
        return getattr(metrics.series._recorder, "_actor", None) if metrics is not None else None

    recorder = ray.get(handle.__ray_call__.remote(actor), timeout=30)
    return None if recorder is None else ray.get(recorder.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def run(quick: bool, log: LogFn) -> list[Result]:
    """Idle controller CPU and RSS at 1,024 ranks (128 with --quick), telemetry on vs off, alternated."""
    n = 128 if quick else RANKS
    pairs = 1 if quick else 3
    idle_s = 10.0 if quick else 30.0
    store = Path(tempfile.mkdtemp(prefix="rayprof-bench-tel-"))
    ensure_ray()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    try:
        for _ in range(pairs):
            for on in (False, True):
                runs[on].append(_one_run(on, n, idle_s, store, log))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    bench = f"{NAME}[{n} ranks, relay per {RANKS_PER_NODE} ranks]"
    note = f"{pairs} alternated pairs, {idle_s:g} s idle each, after every rank heartbeat once"
    results = []
    for on in (False, True):
        label = "metrics + history on" if on else "metrics + history off"
        results += [
            Result.of(bench, f"idle controller CPU, {label}", "%", [r["cpu_pct"] for r in runs[on]], note=note),
            Result.of(bench, f"idle gauge recorder CPU, {label}", "%", [r["recorder_cpu_pct"] for r in runs[on]]),
            Result.of(bench, f"idle controller RSS, {label}", "MiB", [r["rss"] / 2**20 for r in runs[on]]),
            Result.of(bench, f"idle gauge recorder RSS, {label}", "MiB", [r["recorder_rss"] / 2**20 for r in runs[on]]),
        ]
    off, on_ = (statistics.median(r["cpu_pct"] for r in runs[k]) for k in (False, True))
    log(f"{NAME}: idle cpu median off {off:.1f}% / on {on_:.1f}%")
    return results
