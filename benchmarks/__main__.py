"""Command line: run the selected benchmarks, print one table, write JSON.

    python -m benchmarks                   # everything (~15 min on 2 cores)
    python -m benchmarks --quick           # small sizes, a smoke run (< 3 min)
    python -m benchmarks idle window       # just these
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from benchmarks import BENCHMARKS
from benchmarks._stats import REPO, Result, machine_info, prepare_ray_env

DEFAULT_OUT = REPO / "benchmarks" / "results" / "latest.json"


def _fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    a = abs(value)
    if unit in ("x", "ratio"):
        if abs(value - 1) < 0.001:
            return f"{value:.6f}x"  # an effect far below the noise: show it anyway
        return f"{value:.4f}x" if a < 10 else f"{value:.1f}x"
    if a == 0:
        text = "0"
    elif a >= 10000:
        text = f"{value:,.0f}"
    elif a >= 100:
        text = f"{value:.0f}"
    elif a >= 10:
        text = f"{value:.1f}"
    elif a >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def _spread(r: Result) -> str:
    if r.spread is None:
        return "-"
    lo, hi = r.spread
    return f"{r.spread_kind} {_fmt(lo, r.unit)} .. {_fmt(hi, r.unit)} (n={r.n})"


def render_table(results: list[Result]) -> str:
    """The results as a fixed-width text table."""
    header = ("benchmark", "metric", "median", "spread", "target", "met?")
    rows = [
        (
            r.benchmark,
            r.metric,
            _fmt(r.median, r.unit),
            _spread(r),
            r.target or "-",
            {True: "yes", False: "NO", None: "-"}[r.met],
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    notes = [f"  [{r.benchmark}/{r.metric}] {r.note}" for r in results if r.note]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="small sizes and few trials: a smoke run")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT.relative_to(REPO)})")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    selected = [n for n in BENCHMARKS if not args.names or n in args.names]

    # Before anything imports Ray: loopback only, no telemetry, repo importable by workers.
    prepare_ray_env()
    os.chdir(REPO)
    started = time.monotonic()
    machine = machine_info()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    log(f"running {selected} ({'quick' if args.quick else 'full'}) on {machine['cpu_model']}, "
        f"{machine['cpu_cores']} cores")
    results: list[Result] = []
    runtimes: dict[str, float] = {}
    errors: dict[str, str] = {}
    for name in selected:
        t0 = time.monotonic()
        log(f"== {name}")
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            results += module.run(args.quick, log)
        except Exception as e:  # One broken benchmark must not lose the others' numbers.
            errors[name] = "".join(traceback.format_exception(e))
            log(f"{name} failed: {type(e).__name__}: {e}")
            results.append(Result(name, "error", "", None, note=f"{type(e).__name__}: {e}"[:300]))
        runtimes[name] = time.monotonic() - t0
        log(f"== {name} took {runtimes[name]:.0f}s")

    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    total = time.monotonic() - started
    table = render_table(results)
    print(table)
    print(f"\nruntime: {total:.0f}s total; " + ", ".join(f"{k} {v:.0f}s" for k, v in runtimes.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": "quick" if args.quick else "full",
        "machine": machine,
        "runtime_s": {"total": total, **runtimes},
        "results": [r.to_json() for r in results],
        "errors": errors,
        "table": table,
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
