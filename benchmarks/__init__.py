"""rayprof benchmarks: ``python -m benchmarks [--quick] [NAME ...]`` (or ``make bench``).

Each module measures one property the design promises and exposes
``run(quick: bool, log: LogFn) -> list[Result]``:

- ``idle``          cost of the agent's step path with no window armed
- ``idle_process``  the same in a whole Ray Train process: no rayprof / setup hook / hook + control actor / no rayprof
                    again (A/A: what the comparison can resolve), alternated
- ``trigger``       request accepted -> every rank capturing, on a live TorchTrainer job
- ``window``        step-time cost of an open window, and the stall after it closes
- ``artifacts``     bytes per profiled step, upload throughput to S3 (moto) and cluster storage
- ``control_plane`` one controller with hundreds to 4,096 simulated agents, direct and through relays
- ``telemetry``     the controller's idle CPU and memory at 1,024 simulated ranks, metrics + history on vs off
- ``scale``         manifest and merged trace for 64 ranks
- ``analysis_scale`` analyze + merge of 64 ranks of real GPU traces (>= 1 GB), side by side with HTA
- ``culprit``       planted multi-rank cases (8 to 256 ranks) from real traces: is the named straggler the planted one
- ``clock_alignment`` the merge's clock fit on that folder's 64 ranks, each clock moved by a known offset and drift
- ``restart``       controller restart with 1,000 stored profiles x 64 ranks: time, memory, list page bytes
- ``console``       the console's Profiles page with 1,000 stored profiles x 64 ranks, in headless Chromium
- ``soak``          watches, retention and gc left running on a live job while storage fails 10% of calls
- ``long_life``     one controller, 1,000 short uniquely named runs (in process, fake agents): memory flat, nothing kept per ended run

Results go to ``benchmarks/results/latest.json`` and a table on stdout. No
benchmark asserts anything: targets are reported as met or missed.
"""

from __future__ import annotations

from collections.abc import Callable

LogFn = Callable[[str], None]

# Run order: the in-process benchmarks first, the ones that start Ray last.
BENCHMARKS: tuple[str, ...] = ("idle", "window", "artifacts", "scale", "analysis_scale", "culprit", "idle_process", "clock_alignment", "long_life", "trigger", "control_plane", "telemetry", "restart", "console", "soak")

__all__ = ["BENCHMARKS", "LogFn"]
