"""Control-plane scale: one real controller actor, hundreds to 4,096 simulated ranks, direct or through relays.

Simulated agents (:mod:`benchmarks.sim_host`) speak the real protocol from a few
async Ray actors, steps on a fixed clock (``STEP_TIME_S``). With ``per_node`` > 0
they poll through the real relay logic: the controller sees the relays'
``poll_node`` / ``report_many``.

Per scale (256 and 1,024 ranks direct; 1,024 and 4,096 through relays of 8
ranks; a fresh controller each, default ``poll_timeout_s`` = 10 s):

* registration time for all ranks,
* idle: controller CPU and RSS (``/proc`` of its pid) and calls/s served while
  every rank long-polls,
* arm: submit -> all ranks ARMED and -> all CAPTURING (the ranks' own times, as the controller records them),
  ranks that missed the window (also those of a window armed again), submit -> terminal,
* idle again with 10 watches on the target,
* capacity: calls/s served when the sim hosts fire cheap ``report`` calls.
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
from benchmarks.sim_host import SimHost, sum_counters

NAME = "control_plane"
STEP_TIME_S = 0.1
HOSTS = 4
RANKS_PER_NODE = 8
WINDOW_STEPS = 2


def _controller_pid(handle: Any) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def _kill_controller() -> None:
    from actors.controller.handle import find_controller

    handle = find_controller()
    if handle is not None:
        ray.kill(handle, no_restart=True)
        deadline = time.monotonic() + 30
        while find_controller() is not None and time.monotonic() < deadline:
            time.sleep(0.2)


def _one_scale(n: int, per_node: int, quick: bool, store: Path, log: LogFn) -> dict[str, Any]:
    from actors.controller.actor import create_controller
    from orchestrator.client import ProfilingClient
    from orchestrator.client.ray_backend import ActorBackend
    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec
    from orchestrator.models.requests import ProfileRequest

    _kill_controller()
    config = controller_config(StorageSpec(uri=str(store / f"n{n}")))
    handle = create_controller(config)
    ray.get(handle.ping.remote(), timeout=60)
    pid = _controller_pid(handle)
    client = ProfilingClient(backend=ActorBackend(handle))
    out: dict[str, Any] = {"n": n, "per_node": per_node, "poll_timeout_s": config.poll_timeout_s,
                           "rss_empty": proc_rss_bytes(pid)}
    target = f"sim-{n}-{per_node}"
    # Whole simulated nodes per host: rank r is on node r // per_node.
    block = -(-n // HOSTS)
    per_host = [list(range(h * block, min(n, (h + 1) * block))) for h in range(HOSTS)]
    job_started = time.monotonic() - 50 * STEP_TIME_S
    hosts = [SimHost.remote(target, ranks, n, h, STEP_TIME_S, per_node, config.poll_timeout_s, job_started)
             for h, ranks in enumerate(per_host)]
    try:
        reg = ray.get([h.start.remote(2.0 if quick else config.poll_timeout_s) for h in hosts], timeout=300)
        out["register_s"] = max(reg)
        # Settle: every rank has a poll outstanding at the controller.
        deadline = time.monotonic() + config.poll_timeout_s + 60
        while time.monotonic() < deadline:
            c = sum_counters(hosts)
            if c["outstanding_polls"] >= n:
                break
            time.sleep(0.5)
        time.sleep(2.0)

        # Idle: everyone long-polls; measure in slices so we also get a spread.
        idle_s = config.poll_timeout_s + 2 if quick else 2 * config.poll_timeout_s + 2
        slices = 5
        cpu_pct, rss, rate = [], [], []
        c_start, w_start, k_start = proc_cpu_seconds(pid), time.monotonic(), sum_counters(hosts)["total"]
        for _ in range(slices):
            c0, w0, k0 = proc_cpu_seconds(pid), time.monotonic(), sum_counters(hosts)["total"]
            time.sleep(idle_s / slices)
            c1, w1, k1 = proc_cpu_seconds(pid), time.monotonic(), sum_counters(hosts)["total"]
            cpu_pct.append(100 * (c1 - c0) / (w1 - w0))
            rate.append((k1 - k0) / (w1 - w0))
            rss.append(proc_rss_bytes(pid))
        w_end = time.monotonic()
        out.update(idle_cpu_pct=cpu_pct, idle_rss=rss, idle_calls_per_s=rate,
                   idle_total_calls_per_s=(sum_counters(hosts)["total"] - k_start) / (w_end - w_start),
                   idle_total_cpu_pct=100 * (proc_cpu_seconds(pid) - c_start) / (w_end - w_start))
        log(f"{NAME}[{n}/{per_node}]: registered in {out['register_s']:.2f}s; idle cpu {statistics.median(cpu_pct):.1f}%, "
            f"rss {statistics.median(rss) / 2**20:.0f} MiB, {statistics.median(rate):.0f} calls/s")

        # Arm: one request at a time, all ranks.
        arms: list[dict[str, Any]] = []
        for i in range(1 if quick else 3):
            before = sum_counters(hosts)
            c0, k0, m0, w0 = proc_cpu_seconds(pid), before["total"], before["missed"], time.monotonic()
            status = client._backend.call("submit", ProfileRequest(target=target, steps=WINDOW_STEPS, timeout_s=120))
            end = time.monotonic() + 150
            while not status.state.is_terminal and time.monotonic() < end:
                status = client._backend.call("wait", status.id, 10.0)
            w1 = time.monotonic()
            after = sum_counters(hosts)
            c1, k1 = proc_cpu_seconds(pid), after["total"]
            created = status.created_at
            armed = [r.armed_at for r in status.ranks if r.armed_at]
            capturing = [r.capture_started_at for r in status.ranks if r.capture_started_at]
            states: dict[str, int] = {}
            for r in status.ranks:
                states[r.state.value] = states.get(r.state.value, 0) + 1
            arm = {
                "state": status.state.value,
                "rank_states": states,
                # Every miss, also those of a window the controller then armed again.
                "missed": after["missed"] - m0,
                "sync_s": (status.scheduled_at - created).total_seconds() if status.scheduled_at else None,
                "all_armed_s": (max(armed) - created).total_seconds() if len(armed) == n else None,
                "all_capturing_s": (max(capturing) - created).total_seconds() if len(capturing) == n else None,
                "last_capturing_s": (max(capturing) - created).total_seconds() if capturing else None,
                "first_capturing_s": (min(capturing) - created).total_seconds() if capturing else None,
                "armed": len(armed),
                "capturing": len(capturing),
                "terminal_s": w1 - w0,
                "calls_per_s": (k1 - k0) / (w1 - w0),
                "cpu_pct": 100 * (c1 - c0) / (w1 - w0),
            }
            arms.append(arm)
            log(f"{NAME}[{n}/{per_node}]: request {i + 1}: {status.state.value} {states}; sync {arm['sync_s']}, "
                f"all armed {arm['all_armed_s']}, all capturing {arm['all_capturing_s']} s; "
                f"{arm['calls_per_s']:.0f} calls/s, controller cpu {arm['cpu_pct']:.0f}%")
            time.sleep(1.0)
        out["arms"] = arms
        out["rss_after"] = proc_rss_bytes(pid)

        # Idle again with 10 watches on the target: they read the heartbeats already held.
        from orchestrator.models.diagnosis import WatchSpec

        specs = [WatchSpec(target=target, slower_than=1.3)] * 4 + [WatchSpec(target=target, rank_lag=3)] * 3
        specs += [WatchSpec(target=target, stalled=True, action="stacks")] * 3
        watches = [client._backend.call("create_watch", spec) for spec in specs]
        time.sleep(2.0)
        c0, w0 = proc_cpu_seconds(pid), time.monotonic()
        time.sleep(idle_s / 2)
        out["watched_cpu_pct"] = 100 * (proc_cpu_seconds(pid) - c0) / (time.monotonic() - w0)
        for watch in watches:
            client._backend.call("delete_watch", watch.id)
        log(f"{NAME}[{n}/{per_node}]: idle with {len(watches)} watches: cpu {out['watched_cpu_pct']:.1f}%")

        # Capacity: cheap calls from every host at once.
        seconds = 3.0 if quick else 6.0
        c0, w0 = proc_cpu_seconds(pid), time.monotonic()
        done = sum(ray.get([h.hammer.remote(seconds, 32) for h in hosts], timeout=seconds + 120))
        w1 = time.monotonic()
        out["capacity_calls_per_s"] = done / (w1 - w0)
        out["capacity_cpu_pct"] = 100 * (proc_cpu_seconds(pid) - c0) / (w1 - w0)
        log(f"{NAME}[{n}/{per_node}]: capacity {out['capacity_calls_per_s']:.0f} calls/s at {out['capacity_cpu_pct']:.0f}% cpu")
    finally:
        try:
            ray.get([h.stop.remote() for h in hosts], timeout=30)
        except Exception:
            pass
        for h in hosts:
            ray.kill(h)
        _kill_controller()
    return out


def run(quick: bool, log: LogFn) -> list[Result]:
    """Controller behaviour at growing numbers of simulated ranks, each rank calling the controller
    itself, and (``per node 8``) through one relay per 8-rank node."""
    scales = ((128, 0), (128, RANKS_PER_NODE)) if quick else (
        (256, 0), (1024, 0), (1024, RANKS_PER_NODE), (4096, RANKS_PER_NODE))
    store = Path(tempfile.mkdtemp(prefix="rayprof-bench-cp-"))
    ensure_ray()
    runs: list[dict[str, Any]] = []
    try:
        for n, per_node in scales:
            runs.append(_one_scale(n, per_node, quick, store, log))
    finally:
        shutil.rmtree(store, ignore_errors=True)

    results: list[Result] = []
    for r in runs:
        n = r["n"]
        bench = f"{NAME}[{n} ranks, {'relay per ' + str(r['per_node']) + ' ranks' if r['per_node'] else 'direct'}]"
        arms = r["arms"]
        missed = [max(a["missed"], sum(v for k, v in a["rank_states"].items() if k != "DONE")) for a in arms]
        results += [
            Result(bench, "register all ranks", "s", r["register_s"], n=1,
                   note=f"{HOSTS} sim-host actors, {STEP_TIME_S * 1e3:.0f} ms simulated steps, poll_timeout_s "
                   f"{r['poll_timeout_s']:g}, {WINDOW_STEPS}-step windows"),
            Result.of(bench, "idle controller CPU", "%", r["idle_cpu_pct"]),
            Result.of(bench, "idle controller RSS", "MiB", [x / 2**20 for x in r["idle_rss"]],
                      note=f"empty controller: {r['rss_empty'] / 2**20:.0f} MiB; after the requests: "
                      f"{r['rss_after'] / 2**20:.0f} MiB"),
            Result(bench, "idle controller CPU, 10 watches", "%", r["watched_cpu_pct"], n=1,
                   note="4 slower-than, 3 rank-lag, 3 stalled watches on the target, none firing"),
            Result.of(bench, "idle calls served", "calls/s", r["idle_calls_per_s"],
                      note=f"whole idle window: {r['idle_total_calls_per_s']:.1f} calls/s at "
                      f"{r['idle_total_cpu_pct']:.2f}% CPU; expected ~ ranks / poll_timeout = "
                      f"{n / r['poll_timeout_s']:.1f}/s; spread over {len(r['idle_calls_per_s'])} slices"),
            Result.of(bench, "submit -> schedule (sync round)", "s", [a["sync_s"] for a in arms if a["sync_s"]]),
            Result.of(bench, "submit -> all ranks ARMED", "s",
                      [a["all_armed_s"] for a in arms if a["all_armed_s"] is not None],
                      note=f"{sum(1 for a in arms if a['all_armed_s'] is None)} of {len(arms)} requests never had "
                      "every rank armed" if any(a["all_armed_s"] is None for a in arms) else ""),
            Result.of(bench, "submit -> all ranks CAPTURING", "s",
                      [a["all_capturing_s"] for a in arms if a["all_capturing_s"] is not None],
                      note=f"requests: {[a['state'] + ' ' + str(a['rank_states']) for a in arms]}"),
            Result.of(bench, "submit -> last rank CAPTURING (of those that did)", "s",
                      [a["last_capturing_s"] for a in arms if a["last_capturing_s"] is not None],
                      note=f"ranks capturing per request: {[a['capturing'] for a in arms]} of {n}"),
            Result.of(bench, "ranks that missed the window", "ranks", missed,
                      target="0", met=max(missed) == 0 if missed else None),
            Result.of(bench, "calls/s during a request", "calls/s", [a["calls_per_s"] for a in arms]),
            Result.of(bench, "controller CPU during a request", "%", [a["cpu_pct"] for a in arms]),
            Result(bench, "capacity: cheap report() calls", "calls/s", r["capacity_calls_per_s"], n=1,
                   note=f"controller at {r['capacity_cpu_pct']:.0f}% CPU (100% = one core; the actor runs one "
                   "event loop)"),
        ]
    return results
