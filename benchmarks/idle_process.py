"""Idle cost of a whole training process: a one-rank Ray Train job with ~0.1 ms steps,
with no rayprof, with the setup hook only, and with the hook and the control actor.

Each runs as a separate job on one cluster, with a second plain job (A/A),
alternated (ABCD DCBA ...); each round's figures are taken against that round's
plain job, so slow drift in the machine's load cancels.

Timed: the median over ~400-step blocks of wall and thread-CPU time per step. One
process differs from the next with nothing changed (memory layout, which core,
the neighbours; by up to 30% on a shared box), so a ratio inside the A/A spread is
no measured cost, and the row says when the run cannot resolve the target.

Counted: the CPU rayprof adds to the training process, which a box's speed moves
far less than time. The hook's own time per step, measured in the job, plus the CPU
the process's other threads (Ray's, the agent's) took beyond the plain job's, per
second of training CPU. The A/A row is what the count can resolve.

This is what ``idle``'s fast-path numbers cannot see: Ray's worker, the agent's
thread and its calls, and what the setup hook does to the process (it once froze
torch at one thread per core: 1.04-1.07x).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import LogFn
from benchmarks._stats import REPO, Result, ensure_ray, proc_cpu_seconds, summarize
from orchestrator.analysis.significance import mann_whitney_p

NAME = "idle_process"
RATIO_TARGET = 1.005
# "none again" is the A/A control: a plain job like "none", the measurement's own noise.
_MODES = ("none", "hook", "hook+controller", "none again")
_HOOKED = ("hook", "hook+controller")


def _controller(present: bool) -> int | None:
    """Start or stop the control actor; its pid while present."""
    import ray

    from actors.controller.actor import create_controller
    from actors.controller.handle import find_controller
    from benchmarks.control_plane import _controller_pid
    from orchestrator.config import controller_config

    handle = find_controller()
    if present:
        if handle is None:
            handle = create_controller(controller_config(None))
            ray.get(handle.ping.remote())
        return _controller_pid(handle)
    if handle is not None:
        ray.kill(handle)
        deadline = time.monotonic() + 30
        while find_controller() is not None and time.monotonic() < deadline:
            time.sleep(0.2)


def _job(address: str, mode: str, seconds: float, out_dir: Path) -> dict:
    out = out_dir / f"{mode}-{uuid.uuid4().hex[:6]}.json"
    cmd = [sys.executable, "-m", "benchmarks._idle_job", address, "hook" if mode.startswith("hook") else "none",
           str(out), f"idle-{uuid.uuid4().hex[:8]}", str(seconds)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"idle job ({mode}) failed: {done.stderr[-2000:]}")
    data = json.loads(out.read_text())
    data["wall"] = statistics.median(b[0] for b in data["blocks"])
    data["cpu"] = statistics.median(b[1] for b in data["blocks"])
    return data


def run(quick: bool, log: LogFn) -> list[Result]:
    """Alternate the four jobs; ratios of each round's other jobs to its plain one."""
    address = ensure_ray()
    rounds, seconds = (2, 4.0) if quick else (6, 10.0)
    ratios: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": []} for m in _MODES[1:]}
    step_us: list[float] = []
    agent_cpu: list[float] = []
    agent_wakeups: list[float] = []
    controller_cpu: list[float] = []
    threads: dict[str, set[int]] = {m: set() for m in _MODES}
    added: dict[str, list[float]] = {m: [] for m in _MODES[1:]}
    hook_ns: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rayprof-idle-process-") as tmp:
        try:
            for r in range(rounds):
                order = _MODES if r % 2 == 0 else _MODES[::-1]
                got: dict[str, dict] = {}
                for mode in order:
                    pid = _controller(mode == "hook+controller")
                    cpu0, wall0 = (proc_cpu_seconds(pid) if pid else 0.0), time.monotonic()
                    got[mode] = data = _job(address, mode, seconds, Path(tmp))
                    if pid:
                        controller_cpu.append(100 * (proc_cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0))
                    if mode.startswith("hook"):
                        hook_ns.append(data["hook_s"] * 1e9)
                        agent_cpu.append(100 * data["agent_cpu_s"] / data["timed_s"])
                        agent_wakeups.append(data["agent_wakeups"] / data["timed_s"])
                    threads[mode].add(data["torch_threads"])
                    if data["agent_thread"] != mode.startswith("hook"):
                        raise RuntimeError(f"{mode}: the agent {'did not attach' if mode.startswith('hook') else 'ran'}")
                base = got["none"]
                step_us.append(base["wall"] * 1e6)
                for mode in _MODES[1:]:
                    added[mode].append(_added_cpu_pct(got[mode], base))
                    for kind in ("wall", "cpu"):
                        ratios[mode][kind].append(got[mode][kind] / base[kind])
                log(f"idle_process: round {r + 1}/{rounds}: " + ", ".join(
                    f"{m} {got[m]['wall'] * 1e6:.1f} us" for m in _MODES))
        finally:
            _controller(False)
    note = (f"{rounds} rounds x {len(_MODES)} one-rank jobs of {seconds:.0f} s, alternated; ratio to the same round's "
            f"plain job; torch threads seen: " + ", ".join(f"{m} {sorted(t)}" for m, t in threads.items()))
    rows = [
        Result.of(NAME, "plain job step time (wall)", "us", step_us),
        # Counted, not timed: what the agent's thread and the control actor took while the steps ran.
        Result.of(NAME, "agent thread CPU while the steps are timed", "% of a core", agent_cpu,
                  note="its own thread's CPU clock over the timed blocks of every hooked job"),
        Result.of(NAME, "agent thread wake-ups while the steps are timed", "/s", agent_wakeups,
                  note="context switches of that thread: each is one time it ran (and took the GIL)"),
        Result.of(NAME, "control actor CPU during a hooked job", "% of a core", controller_cpu,
                  note="the whole job's life, from its start to its end: registration and its heartbeats"),
        Result.of(NAME, "optimizer hook, per step", "ns", hook_ns,
                  note="an optimizer that does nothing, stepped with and without the global post-hooks, in the job"),
    ]
    aa_added = added["none again"]
    rows.append(Result.of(NAME, "CPU added to the training process, none again / none", "% of a step", aa_added,
                          note="A/A: two plain jobs; what the count can resolve"))
    for mode in _HOOKED:
        rows.append(_verdict(f"CPU added to the training process, {mode} / none", "% of a step", added[mode],
                             aa_added, 0.0, 100 * (RATIO_TARGET - 1), note=(
            "counted, not timed: the hook's time per step, plus the CPU the process's other threads "
            "(Ray's and the agent's) took beyond the plain job's, per second of training CPU; "
            f"{_within(added[mode], aa_added)}")))
    for kind in ("wall", "cpu"):
        clock = "thread CPU" if kind == "cpu" else kind
        noise = ratios["none again"][kind]
        for mode in _HOOKED:
            values = ratios[mode][kind]
            rows.append(_verdict(f"step ratio {mode} / none ({clock})", "x", values, noise, 1.0, RATIO_TARGET,
                                 note=f"{note}; {_within(values, noise)}"))
        rows.append(Result.of(NAME, f"step ratio none again / none ({clock})", "x", noise,
                              note="A/A: two plain jobs; what the comparison can resolve"))
    return rows


def _added_cpu_pct(job: dict, plain: dict) -> float:
    """The CPU rayprof adds to a training process, in % of a step: the hook's time in each step, plus the
    CPU its other threads took beyond the plain job's, both per second of the training thread's CPU."""
    per_step = job["train_cpu_s"] / job["steps"]
    others = job["others_cpu_s"] / job["train_cpu_s"] - plain["others_cpu_s"] / plain["train_cpu_s"]
    return 100 * (job["hook_s"] / per_step + others)


def _verdict(label: str, unit: str, values: list[float], noise: list[float], zero: float, target: float,
             note: str) -> Result:
    """``values`` against ``target``; met or missed only when the A/A values (``noise``, ideally ``zero``)
    are tight enough to tell: half their interquartile range within the target's margin."""
    spread = summarize(noise)
    resolution = (spread.p75 - spread.p25) / 2
    resolved = resolution <= target - zero
    return Result.of(
        NAME, label, unit, values, target=f"<= {target:g}",
        met=statistics.median(values) <= target if resolved else None,
        note=f"{note}; A/A median {spread.median:.3f}, range {spread.min:.3f}-{spread.max:.3f}"
        f"{'' if resolved else f', half-IQR {resolution:.3g}: this run cannot resolve {target - zero:.3g}'}")


def _within(values: list[float], noise: list[float]) -> str:
    """Whether the ratios stand apart from the A/A ones: the diff's Mann-Whitney U test (exact for few rounds)."""
    p = mann_whitney_p(values, noise)
    if p >= 0.05:
        return f"not distinguishable from A/A (Mann-Whitney p = {p:.2f})"
    side = "above" if statistics.median(values) > statistics.median(noise) else "below"
    return f"{side} A/A (Mann-Whitney p = {p:.2f})"
