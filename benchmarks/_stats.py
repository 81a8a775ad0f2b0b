"""Small shared helpers: result rows, robust statistics, machine description, process probes.

Every benchmark reports a median and a spread, never a single sample: the
machine is shared (other test runs may be going on), so absolute times drift.
Where that matters, benchmarks interleave A/B trials and report the *ratio*
of neighbouring trials, which cancels most of the drift.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "REPO",
    "Result",
    "Summary",
    "load_train_job",
    "machine_info",
    "no_gc",
    "proc_cpu_seconds",
    "proc_rss_bytes",
    "ensure_ray",
    "prepare_ray_env",
    "summarize",
]

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Summary:
    """Median and spread of a sample."""

    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int

    @property
    def iqr(self) -> tuple[float, float]:
        return (self.p25, self.p75)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    # Linear interpolation between closest ranks (numpy's default), no numpy needed.
    if not sorted_values:
        raise ValueError("empty sample")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``."""
    return _quantile(sorted(values), q)


def summarize(values: Sequence[float]) -> Summary:
    """Median, quartiles and range of a non-empty sample."""
    s = sorted(float(v) for v in values)
    return Summary(
        median=statistics.median(s),
        p25=_quantile(s, 0.25),
        p75=_quantile(s, 0.75),
        min=s[0],
        max=s[-1],
        n=len(s),
    )


@dataclass
class Result:
    """One row of the results table.

    ``spread`` is ``(low, high)``: the interquartile range when ``n >= 4``,
    else min-max (a quartile of three samples says nothing). ``met`` is
    ``None`` for informational rows without a target.
    """

    benchmark: str
    metric: str
    unit: str
    median: float | None
    spread: tuple[float, float] | None = None
    spread_kind: str = ""
    n: int = 0
    target: str = ""
    met: bool | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        benchmark: str,
        metric: str,
        unit: str,
        values: Sequence[float],
        *,
        target: str = "",
        met: bool | None = None,
        note: str = "",
        keep_samples: bool = True,
    ) -> Result:
        """A row from raw samples; ``met`` may be decided by the caller from the median."""
        if not values:
            return cls(benchmark, metric, unit, None, target=target, met=met, note=note or "no samples")
        s = summarize(values)
        if s.n >= 4:
            spread, kind = s.iqr, "IQR"
        else:
            spread, kind = (s.min, s.max), "min-max"
        return cls(
            benchmark,
            metric,
            unit,
            s.median,
            spread,
            kind,
            s.n,
            target,
            met,
            note,
            [float(v) for v in values] if keep_samples and len(values) <= 2000 else [],
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["spread"] = list(self.spread) if self.spread else None
        return d


@contextmanager
def no_gc() -> Iterator[None]:
    """Keep the cyclic GC out of a timed block: its pauses land at random and dwarf ns-scale effects."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_train_job() -> ModuleType:
    """``deploy/examples/train_job.py`` as a module (``deploy`` is not a package)."""
    name = "rayprof_bench_train_job"
    if name in sys.modules:
        return sys.modules[name]
    path = REPO / "deploy" / "examples" / "train_job.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def prepare_ray_env() -> None:
    """Environment every Ray process must inherit: loopback only, no telemetry, repo importable.

    Set before ``ray.init`` so the raylet and every worker see it.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])


def ensure_ray() -> str:
    """Start (once per run) a local Ray cluster on loopback; returns its GCS address.

    Shared by the Ray benchmarks so a full run pays Ray's start-up once;
    ``benchmarks.__main__`` shuts it down at the end.
    """
    prepare_ray_env()
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, namespace="rayprof-bench")
    return ray.get_runtime_context().gcs_address


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may contain spaces; fields after the closing paren are fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "sched_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": _mem_total(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for mod in ("torch", "ray", "pydantic", "boto3", "moto"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:
            info[f"{mod}_version"] = None
    return info
