"""Do the steps after profiling windows run slower, and whose cost is it? The lasting-cost probe.

    python -m benchmarks.gpu_lasting --out benchmarks/results/gpu-h200-lasting.json    # on a CUDA machine, ~3 min
    python -m benchmarks.gpu_lasting --device cpu --rounds 1 --steps 20 --out /tmp/l.json

The device check (benchmarks/gpu.py) times 100 steps before 10 windows and 100 after; on a launch-bound step the
steps after were 1.10-1.32x slower in some runs and not in others, the A/A spread much tighter. Each setting below
runs in a fresh process, the settings interleaved round by round (a machine's drift reaches them alike):

- ``sham``: the same steps a window's would be, and no window at all (the measurement's own drift);
- ``cpu`` / ``cpu,cuda``: real windows with those activities, the agent's own work only;
- ``cpu,cuda+read``: the same, and the check's reading of each trace back (what benchmarks/gpu.py does);
  on CPU (``--device cpu``, a rehearsal) ``cpu+read``;
- ``cpu,cuda+teardown``: CPU + CUDA windows with Kineto's ``TEARDOWN_CUPTI=1`` (CUPTI finalized after each window).
  Upstream (pytorch/pytorch issue 144455, open) reports training 10-20% slower after profiling because Kineto leaves
  CUPTI attached by default; torch sets ``TEARDOWN_CUPTI=0`` itself where CUDA graphs and CUPTI re-init crash
  (CUDA < 12.6), so the agent cannot turn teardown on blind: this setting is the evidence it would need;
- ``torch:cpu`` / ``torch:cpu,cuda`` / ``torch:cpu,cuda+teardown``: the same windows taken with ``torch.profiler``
  alone (no agent: a ``profile`` context over the window's steps, its trace written with ``export_chrome_trace``):
  whether a lasting cost is rayprof's or torch's own. On CPU ``torch:cpu``.

A setting's ratios above sham's are its lasting cost. ``--setting`` (repeatable) runs only those named. Needs torch and rayprof's small dependencies only, as the check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_driver import WINDOW_STEPS, Driver, loops

SETTINGS = ("sham", "cpu", "cpu,cuda", "cpu,cuda+read", "cpu,cuda+teardown", "torch:cpu", "torch:cpu,cuda",
            "torch:cpu,cuda+teardown")
CPU_SETTINGS = ("sham", "cpu", "cpu+read", "torch:cpu")  # a rehearsal of the flow where there is no CUDA device


def child(setting: str, device: torch.device, model: str, windows: int, steps: int) -> dict[str, Any]:
    """One process's run: step times (median ms) before the windows (twice), after the first, after the last (twice)."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="rayprof-lasting-") as tmp:
        driver = Driver(Path(tmp) / "store", device)
        bare = setting.startswith("torch:")
        driver.activities = setting.removeprefix("torch:").split("+")[0].split(",") if setting != "sham" else []
        driver.read_traces = setting.endswith("+read")
        loop = loops(device, quick=device.type == "cpu")[model]
        driver.train(loop, 10)
        med = lambda: statistics.median(driver.train(loop, steps))  # noqa: E731

        def window(i: int) -> None:
            if setting == "sham":
                driver.train(loop, WINDOW_STEPS + 2)  # armed 2 steps ahead, then its steps
            elif bare:
                driver.train(loop, 2)
                kinds = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
                with profile(activities=[kinds[a] for a in driver.activities]) as prof:
                    driver.train(loop, WINDOW_STEPS)
                prof.export_chrome_trace(str(Path(tmp) / f"w{i}.json"))
            else:
                facts = driver.window(loop, f"w{i}")
                if facts["state"] != "DONE":
                    raise RuntimeError(f"window {i}: {facts['state']} {facts['reason']}")

        before, before_again = med(), med()
        window(0)
        after_first = med()
        for i in range(1, windows):
            window(i)
        after, after_again = med(), med()
    return {"setting": setting, "before": before, "a_a": before_again / before, "after_first": after_first / before,
            "after": after / before, "after_again": after_again / before}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setting, each ratio's median and range over its processes."""
    out: dict[str, Any] = {}
    for setting in dict.fromkeys(r["setting"] for r in runs):
        mine = [r for r in runs if r.get("setting") == setting and "error" not in r]
        if mine:
            out[setting] = {k: {"median": statistics.median(r[k] for r in mine), "min": min(r[k] for r in mine),
                                "max": max(r[k] for r in mine)} for k in ("a_a", "after_first", "after", "after_again")}
    return out


def _result(args: argparse.Namespace, runs: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    return {"what": __doc__.split("\n")[0], "model": args.model, "windows": args.windows, "steps": args.steps,
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "runs": runs, "summary": summarize(runs), "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_lasting", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="where to write the results (JSON)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", choices=["cnn", "transformer"], default="transformer")
    parser.add_argument("--rounds", type=int, default=4, help="processes per setting")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="steps per timed median")
    parser.add_argument("--setting", action="append", choices=SETTINGS + CPU_SETTINGS,
                        help="run only this setting (repeatable; default: every one the device has)")
    parser.add_argument("--child", choices=SETTINGS + CPU_SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu_lasting: no CUDA device here; run it on a GPU machine, or --device cpu", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(child(args.child, torch.device(args.device), args.model, args.windows, args.steps)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started, runs, result = time.monotonic(), [], {}
    settings = tuple(args.setting or (SETTINGS if args.device == "cuda" else CPU_SETTINGS))
    for n in range(args.rounds):
        for setting in settings[n % len(settings):] + settings[: n % len(settings)]:  # a different setting first each round
            cmd = [sys.executable, "-m", "benchmarks.gpu_lasting", "--child", setting, "--device", args.device,
                   "--model", args.model, "--windows", str(args.windows), "--steps", str(args.steps)]
            env = {**os.environ, **({"TEARDOWN_CUPTI": "1"} if setting.endswith("+teardown") else {})}
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            lines = done.stdout.strip().splitlines()
            runs.append(json.loads(lines[-1]) if done.returncode == 0 and lines else
                        {"setting": setting, "error": done.stderr[-1500:]})
            result = _result(args, runs, time.monotonic() - started)
            args.out.write_text(json.dumps(result, indent=1))  # after each process: a cut-short run keeps what it has
    print(json.dumps(result["summary"], indent=1))
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
