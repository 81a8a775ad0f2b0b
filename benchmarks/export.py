"""Export child: peak memory and time on a large trace, with and without the byte cap.

The trace is a real A100 trace (HTA's ``trace_diff_control``, six steps) with
its events repeated, shifted in time and renumbered (steps, correlation and
External ids, flow ids) until it reaches the wanted raw size: ~200 MiB by
default, 32 MiB with ``--quick``. The child runs as an agent runs it
(``python -m actors.export RAW OUT --memory --shapes [--max-bytes N]``); its
peak RSS is ``ru_maxrss`` of that child alone (from ``wait4`` in a small launcher), so no sampling can miss it.
The cut run uses a cap of 60% of the raw size: it parses the trace twice and
writes only the steps that fit.

    python -m benchmarks.export [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import LogFn
from benchmarks._stats import REPO, Result

NAME = "export"
MIB = 1024 * 1024
SOURCE = REPO.parent / "shared" / "external-traces" / "hta_trace_diff_control_a100_r3of8" / "traces" / "control.pt.trace.json.gz"
# Peak RSS per raw byte the design allows the child: a fraction, not a multiple.
TARGET_RSS_PER_RAW_BYTE = 0.5


def make_large_trace(source: Path, dest: Path, target_bytes: int) -> int:
    """Write ``source``'s events repeated (shifted, renumbered) to ``dest`` until ``target_bytes``; returns its size."""
    with gzip.open(source, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    events: list[dict[str, Any]] = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    steps = [int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_offset = max(steps) - min(steps) + 1
    id_offset = 1 + max(
        [int(v) for e in events for k, v in (e.get("args") or {}).items() if k in ("correlation", "External id") and isinstance(v, int)]
        + [int(e["id"]) for e in events if isinstance(e.get("id"), int)]
    )
    written = 0
    with open(dest, "w", encoding="utf-8") as out:
        head = json.dumps(trace)[:-1]
        out.write(f'{head}, "traceEvents": [\n')
        written += len(head) + 19
        copy = 0
        first = True
        while written < target_bytes:
            for ev in events:
                if copy and ev.get("ph") == "M":
                    continue  # metadata once
                shifted = _shifted(ev, copy, span, step_offset, id_offset)
                text = json.dumps(shifted)
                out.write(text if first else ",\n" + text)
                written += len(text) + (0 if first else 2)
                first = False
            copy += 1
        out.write("\n]}\n")
    return dest.stat().st_size


def _shifted(ev: dict[str, Any], copy: int, span: float, step_offset: int, id_offset: int) -> dict[str, Any]:
    if copy == 0:
        return ev
    ev = dict(ev)
    if isinstance(ev.get("ts"), int | float):
        ev["ts"] = ev["ts"] + copy * span
    name = str(ev.get("name", ""))
    if name.startswith("ProfilerStep#"):
        ev["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy * step_offset}"
    if isinstance(ev.get("id"), int):
        ev["id"] = ev["id"] + copy * id_offset
    args = ev.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] = args[key] + copy * id_offset
        ev["args"] = args
    return ev


# Linux keeps a process's peak RSS across exec, so a child forked from this
# process (which held a parsed trace) would report our size: a small launcher
# forks the export child, sends its stdout to argv[1], and reports the child's own peak.
_LAUNCHER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
with open(sys.argv[1], "w") as stdout:
    child = subprocess.Popen(sys.argv[2:], stdout=stdout, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, time.perf_counter() - started]))
sys.stderr.write(child.stderr.read().decode()[-2000:])
"""


def run_child(raw: Path, out: Path, *extra: str) -> tuple[float, float, dict[str, Any]]:
    """Run the export child once; returns (its own peak RSS in bytes, seconds, its JSON result)."""
    cmd = [sys.executable, "-m", "actors.export", str(raw), str(out), "--memory", "--shapes", *extra]
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        done = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, result.name, *cmd], capture_output=True, text=True, cwd=REPO, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"launcher failed: {done.stderr[-2000:]}")
        status, peak, seconds = json.loads(done.stdout)
        if status != 0:
            raise RuntimeError(f"export child exited {status}: {done.stderr}")
        return float(peak), float(seconds), json.loads(result.read())


def run(quick: bool, log: LogFn) -> list[Result]:
    target = (32 if quick else 200) * MIB
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rayprof-bench-export-") as tmp:
        raw = Path(tmp) / "trace.json"
        size = make_large_trace(SOURCE, raw, target)
        log(f"export: {size / MIB:.0f} MiB trace from {SOURCE.name}")
        for label, extra in (("whole", ()), ("cut at 60%", ("--max-bytes", str(int(size * 0.6))))):
            out = Path(tmp) / label.replace(" ", "-").replace("%", "")
            out.mkdir()
            rss, seconds, result = run_child(raw, out, *extra)
            written = sum(p.stat().st_size for p in out.iterdir())
            note = f"{size / MIB:.0f} MiB raw, {len(result['steps'])} steps kept, {written / MIB:.1f} MiB written"
            log(f"export {label}: peak RSS {rss / MIB:.0f} MiB, {seconds:.1f} s; {note}")
            results.append(
                Result.of(
                    NAME, f"child peak RSS / raw bytes ({label})", "ratio", [rss / size],
                    target=f"<= {TARGET_RSS_PER_RAW_BYTE}", met=rss / size <= TARGET_RSS_PER_RAW_BYTE, note=note,
                )
            )
            results.append(Result.of(NAME, f"child peak RSS ({label})", "MiB", [rss / MIB], note=note))
            results.append(Result.of(NAME, f"child time ({label})", "s", [seconds], note=f"{size / seconds / MIB:.0f} MiB/s"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = run(args.quick, lambda line: print(line, file=sys.stderr, flush=True))
    for r in results:
        print(f"{r.metric:45s} {r.median:10.3f} {r.unit:6s} {r.target:8s} {r.note}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))


if __name__ == "__main__":
    main()
