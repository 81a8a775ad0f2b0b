"""Long life: one controller sees 1,000 short runs with unique names come and go, then sits idle.

The control actor is detached: on a real cluster it outlives hundreds of training
runs, each named ``ray_train_run-<date>``. This drives the real ``Controller`` in
this process without Ray, with the fake agents of ``tests/support/fake_agents.py`` (the
one home of an in-process agent; run from the repository root): each run has
``RANKS`` ranks that register, heartbeat and leave; every tenth takes a profile
window, every twentieth stalls (the stall detector takes every rank's stacks),
every twenty-fifth has a watch (created, then deleted when the run ends). Runs
overlap, ``CONCURRENT`` at a time. Gauges go to the real recorder
(:class:`~actors.controller.monitoring.recorder.MetricRecorder`) run in this process,
into counters standing in for Ray's gauges (which label sets were set, and which are still
being set); a recorder the controller ended stands for a process whose series Ray forgets.
An ended run's gauges are held ``ENDED_KEPT_S`` (not 150 s), so the recorder is replaced
within the benchmark.
``ended_run_kept_s`` is short so that what the controller keeps per run is
dropped within the benchmark, as it would be an hour after each run in a month.

Every 100 runs: the process's RSS and live Python objects (after a full
collection), and what the controller holds per target, run and agent. Then the
history answer's size at 1,024 ranks over 10 minutes (the default
``max_points``), and the exported label sets. Verdict: RSS after the last run
within ``RSS_SLACK_MIB`` of RSS after the first 100 runs, and the per-run holders
empty after the idle period.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import LogFn
from benchmarks._stats import Result, proc_rss_bytes

NAME = "long_life"
RUNS = 1000
QUICK_RUNS = 200
RANKS = 4
CONCURRENT = 10
EVERY = 100
# What a month of runs may add after the first 100: allocator slack and caches of bounded size.
RSS_SLACK_MIB = 24.0
GRACE_S = 1.5
ENDED_KEPT_S = 1.0
HISTORY_RANKS = 1024
HISTORY_SPAN_S = 600


class _Gauge:
    """Stands in for one ray.util.metrics object. It counts the label sets ever set (what Ray 2.43 exports
    for the process's life) and holds only those set within ``_IDLE_S`` (what Ray 2.60 still exports): a
    record of every label set would itself grow with the runs, and be measured as the controller's."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}
        self.ever = 0
        # Label sets of state gauges that went idle at a value other than 0: an alert that never clears.
        self.left_set = 0

    def set(self, value: float, tags: dict[str, str]) -> None:
        key = tuple(sorted(tags.items()))
        if key not in self.last:
            self.ever += 1
        self.last[key] = (value, time.monotonic())

    inc = observe = set

    def age_out(self) -> None:
        now = time.monotonic()
        for key, (value, at) in list(self.last.items()):
            if now - at > _IDLE_S:
                self.left_set += self.name in _STATE_GAUGES and value != 0.0
                del self.last[key]


# Twice the recorder's refresh period (recorder.GAUGE_REFRESH_S): a live label set is set within it.
_IDLE_S = 10.0


def _recorders() -> Any:
    """The controller's recorder seam: the real MetricRecorder here, each gauge a lean :class:`_Gauge`."""
    from tests.support.local_recorder import LocalRecorders

    return LocalRecorders(metric=lambda d: _Gauge(d.name))


def _gauges(recorders: Any, running: bool = False) -> list[_Gauge]:
    return [g for r in recorders.started if not (running and r.closed) for g in r.metrics.values()]


def _refresh(recorders: Any) -> None:
    """What each running recorder process's refresh thread does every GAUGE_REFRESH_S."""
    for r in recorders.running():
        r.recorder.refresh()


def _stale_nonzero(recorders: Any) -> int:
    """State gauges an ended recorder left at a value other than 0: what Ray 2.43 shows for its last minutes
    (a live one's copies are set to 0 before it ends)."""
    return sum(
        value != 0.0
        for r in recorders.started
        if r.closed
        for g in r.metrics.values()
        if g.name in _STATE_GAUGES
        for value, _ in g.last.values()
    )


def _holders(c: Any) -> dict[str, int]:
    """What the controller keys by target, run or agent."""
    return {
        "watch series": len(c._watches._series),
        "stall stacks": len(c._watches.stall_stacks),
        "queue slots": len(c._queue._slots),
        "arm rounds": len(c._runner._arm_rounds),
        "gone agents": len(c._registry._gone),
        "histories": len(c._telemetry.history.runs),
        "gauge label sets": c._telemetry._metrics.label_sets(),
        "workers": len(c._registry.workers),
    }


async def _one_run(c: Any, i: int) -> None:
    from orchestrator.models.diagnosis import WatchSpec
    from orchestrator.models.requests import ProfileRequest
    from tests.support.fake_agents import FakeAgent, until, wait_terminal, worker_info

    name = f"ray_train_run-2026-11-28_{i:05d}"
    agents = [FakeAgent(c, worker_info(r, RANKS, target=name, job=f"job{i}")) for r in range(RANKS)]
    for a in agents:
        await a.start()
    watch = None
    if i % 25 == 0:
        watch = await c.create_watch(WatchSpec(target=name, rank_lag=1000, for_s=60, action="stacks"))
    # A few monitor ticks of heartbeats: history points, gauges, a watch's series.
    await until(lambda: name in c._watches._series, timeout_s=10)
    if i % 10 == 0:
        await wait_terminal(c, (await c.submit(ProfileRequest(target=name, steps=2))).id, timeout_s=30)
    if i % 20 == 0:
        for a in agents:
            a.training = False
        await until(lambda: any(k[0] == name for k in c._watches.stall_stacks), timeout_s=15)
    for a in agents:
        await a.stop()
    if watch is not None:
        await c.delete_watch(watch.id)


def _sample(c: Any, recorders: Any) -> dict[str, Any]:
    for gauge in _gauges(recorders, running=True):
        gauge.age_out()
    gc.collect()
    return {"rss_mib": proc_rss_bytes(os.getpid()) / 2**20, "objects": len(gc.get_objects()), **_holders(c)}


async def _history_answer(c: Any) -> dict[str, float]:
    """The answer for 10 minutes of 1 s points at 1,024 ranks, through the controller."""
    from actors.controller.monitoring.step_history import RunHistory

    now = time.time()
    history = RunHistory("bench-history", "job")
    for rank in range(HISTORY_RANKS):
        step_s = 0.1 + (0.05 if rank % 97 == 0 else 0.0)
        for s in range(HISTORY_SPAN_S):
            history.add(rank, now - HISTORY_SPAN_S + s + 0.5, s * 10, step_s)
    c._telemetry.history.runs[("bench-history", "job")] = history
    started = time.monotonic()
    answer = await c.history("bench-history", span_s=HISTORY_SPAN_S)
    took = time.monotonic() - started
    c._telemetry.history.runs.pop(("bench-history", "job"), None)
    body = json.dumps(answer.model_dump(mode="json")).encode()
    points = sum(len(r.t) for r in answer.ranks) + (len(answer.band.t) if answer.band else 0)
    return {"bytes": float(len(body)), "points": float(points), "ranks_listed": float(len(answer.ranks)), "s": took}


async def _scenario(runs: int, store: Path, log: LogFn) -> dict[str, Any]:
    from orchestrator.models.agent_protocol import StorageSpec
    from tests.support.fake_agents import MONITORED, make_controller, until

    recorders = _recorders()
    c = make_controller(
        StorageSpec(uri=str(store)), recorder=recorders, **MONITORED, ended_run_kept_s=GRACE_S, metrics_ended_kept_s=ENDED_KEPT_S
    )
    # The controller logs every registration and drop at INFO: 8,000 lines say nothing here.
    logging.getLogger("actors").setLevel(logging.WARNING)
    await c.ping()

    async def refresh() -> None:
        from actors.controller.monitoring.recorder import GAUGE_REFRESH_S

        while True:  # cancelled when the scenario ends
            await asyncio.sleep(GAUGE_REFRESH_S)
            _refresh(recorders)

    refreshing = asyncio.get_running_loop().create_task(refresh())
    curve: list[dict[str, Any]] = []
    started = time.monotonic()
    for first in range(0, runs, CONCURRENT):
        await asyncio.gather(*(_one_run(c, i) for i in range(first, min(runs, first + CONCURRENT))))
        done = first + CONCURRENT
        if done % EVERY == 0:
            sample = {"runs": done, "s": time.monotonic() - started, **_sample(c, recorders)}
            curve.append(sample)
            log(f"{NAME}: {done} runs: rss {sample['rss_mib']:.1f} MiB, objects {sample['objects']:,}, " + ", ".join(
                f"{k} {v}" for k, v in sample.items() if k not in ("runs", "s", "rss_mib", "objects")
            ))
    # Idle: every run has left; past the grace period nothing of them is held.
    expiry = c._settings().poll_timeout_s + c._settings().worker_expiry_grace_s
    emptied = await until(
        lambda: not any(v for k, v in _holders(c).items()), timeout_s=expiry + 10 * GRACE_S + 10, interval_s=0.1
    )
    idle = {"runs": runs, "s": time.monotonic() - started, **_sample(c, recorders)}
    log(f"{NAME}: idle: rss {idle['rss_mib']:.1f} MiB, objects {idle['objects']:,}, holders {_holders(c)}")
    await asyncio.sleep(_IDLE_S + 1)  # the idle period: every ended run's label sets age out
    for gauge in _gauges(recorders, running=True):
        gauge.age_out()
    ever = sum(g.ever for g in _gauges(recorders) if g.name in _GAUGES)
    # What Ray 2.43 still exports: every label set the recorders still running ever set.
    exported = sum(g.ever for g in _gauges(recorders, running=True))
    nonzero_state = sum(g.left_set for g in _gauges(recorders)) + _stale_nonzero(recorders)
    refreshing.cancel()
    history = await _history_answer(c)
    return {
        "curve": curve, "idle": idle, "emptied": emptied, "ever": ever, "exported": exported, "nonzero": nonzero_state,
        "recorders": len(recorders.started), "history": history,
    }


_GAUGES = {
    "rayprof_step_time_seconds", "rayprof_step_time_median_seconds", "rayprof_steps_behind", "rayprof_seconds_since_step",
    "rayprof_stalled", "rayprof_lagging_ranks", "rayprof_ranks", "rayprof_post_window_ratio",
}
_STATE_GAUGES = {"rayprof_stalled", "rayprof_lagging_ranks", "rayprof_ranks", "rayprof_steps_behind", "rayprof_seconds_since_step"}


def run(quick: bool, log: LogFn) -> list[Result]:
    runs = QUICK_RUNS if quick else RUNS
    store = Path(tempfile.mkdtemp(prefix="rayprof-long-life-"))
    try:
        found = asyncio.run(_scenario(runs, store, log))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    curve, idle, history = found["curve"], found["idle"], found["history"]
    first, last = curve[0], curve[-1]
    growth = last["rss_mib"] - first["rss_mib"]
    log(f"{NAME}: curve (runs: RSS MiB / objects): " + "; ".join(f"{s['runs']}: {s['rss_mib']:.1f} / {s['objects']:,}" for s in curve))
    note = f"{runs} runs of {RANKS} ranks, {CONCURRENT} at a time, grace {GRACE_S:g}s; {curve[-1]['s']:.0f}s"
    return [
        Result.of(NAME, f"RSS after {first['runs']} runs", "MiB", [first["rss_mib"]], note=note),
        Result.of(
            NAME,
            f"RSS growth, run {first['runs']} to {last['runs']}",
            "MiB",
            [growth],
            target=f"< {RSS_SLACK_MIB:g} MiB",
            met=growth < RSS_SLACK_MIB,
            note="curve: " + ", ".join(f"{s['rss_mib']:.0f}" for s in curve),
        ),
        Result.of(
            NAME,
            f"objects growth, run {first['runs']} to {last['runs']}",
            "objects",
            [float(last["objects"] - first["objects"])],
            note="curve: " + ", ".join(f"{s['objects']}" for s in curve),
        ),
        Result.of(
            NAME,
            "per-run holders after idle (series, stacks, slots, rounds, agents, histories, label sets, workers)",
            "entries",
            [float(sum(v for k, v in _holders_of(idle).items()))],
            target="0",
            met=found["emptied"],
        ),
        Result.of(
            NAME, "gauge label sets ever set", "sets", [float(found["ever"])], note=f"by {found['recorders']} recorder processes"
        ),
        Result.of(
            NAME,
            "gauge label sets still exported after idle on Ray 2.43 (a recorder still running)",
            "sets",
            [float(found["exported"])],
            target="0",
            met=found["exported"] == 0,
        ),
        Result.of(
            NAME,
            "state gauges not at 0 after the runs ended",
            "sets",
            [float(found["nonzero"])],
            target="0",
            met=found["nonzero"] == 0,
        ),
        Result.of(
            NAME,
            f"history answer, {HISTORY_RANKS} ranks x {HISTORY_SPAN_S}s (default max_points)",
            "KiB",
            [history["bytes"] / 1024],
            note=f"{history['points']:.0f} points, {history['ranks_listed']:.0f} ranks listed + band, "
            f"built in {history['s']:.2f}s (unbounded: 614,400 points, ~26 MB)",
        ),
    ]


def _holders_of(sample: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in sample.items() if k not in ("runs", "s", "rss_mib", "objects")}
