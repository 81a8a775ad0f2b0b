"""Controller restart with many stored profiles: time, memory, and what a list page weighs.

A long-running cluster keeps up to ``RAYPROF_RETENTION_COUNT`` (1,000)
finished profiles. Each trial starts a fresh controller (the real class, in a
child process of its own so its RSS is its own) on a home storage holding
1,000 saved profiles x 64 ranks, and times its first call (which restores
the saved state). The first trial starts without the controller's index of
finished profiles, as the first start after an upgrade does; the others find
the index it wrote. Then: bytes of the first list page (100 profiles, as
``GET /v1/profiles`` sends it) and the time to get one finished profile in full.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import LogFn
from benchmarks._stats import REPO, Result, proc_rss_bytes
from benchmarks._stored import CLUSTER, write_saved_profiles

NAME = "restart"


async def _restart(root: str) -> dict[str, Any]:
    import os

    from actors.controller.actor import Controller
    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec
    from tests.support.local_recorder import LocalRecorders

    baseline = proc_rss_bytes(os.getpid())
    config = controller_config(StorageSpec(uri=root)).model_copy(update={"cluster_name": CLUSTER})
    controller = Controller(config, postprocess=object(), cluster=CLUSTER, recorder=LocalRecorders())
    t0 = time.perf_counter()
    await controller.ping()
    restart_s = time.perf_counter() - t0
    rss = proc_rss_bytes(os.getpid())
    page = await controller.list(limit=100)
    t0 = time.perf_counter()
    full = await controller.get(page.profiles[-1].id)
    get_s = time.perf_counter() - t0
    return {
        "restart_s": restart_s, "rss_growth": rss - baseline, "total": page.total,
        "page_bytes": len(page.model_dump_json()), "get_s": get_s, "get_ranks": len(full.ranks),
    }


def child(root: str) -> None:
    print("RESULT " + json.dumps(asyncio.run(_restart(root))), flush=True)


def _trial(root: Path) -> dict[str, Any]:
    code = f"from benchmarks.restart import child; child({str(root)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"restart child failed (rc {proc.returncode}): {proc.stderr[-2000:]}")


def run(quick: bool, log: LogFn) -> list[Result]:
    """1,000 profiles x 64 ranks (100 x 16 with --quick), 4 restarts (2 with --quick)."""
    from orchestrator.layout import index_key
    from orchestrator.models.agent_protocol import StorageSpec

    count, ranks, trials = (100, 16, 2) if quick else (1000, 64, 4)
    root = Path(tempfile.mkdtemp(prefix="rayprof-bench-restart-"))
    try:
        t0 = time.monotonic()
        write_saved_profiles(StorageSpec(uri=str(root)), count, ranks)
        log(f"saved {count} profiles x {ranks} ranks in {time.monotonic() - t0:.1f}s "
            f"({sum(f.stat().st_size for f in root.rglob('*.json')) / 2**20:.0f} MiB)")
        (root / index_key(CLUSTER)).unlink(missing_ok=True)
        runs = []
        for i in range(trials):
            runs.append(_trial(root))
            log(f"trial {i}: {runs[-1]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    what = f"{count} profiles x {ranks} ranks"
    cold, warm = runs[0], runs[1:]
    return [
        Result.of(NAME, f"restart, no index yet ({what})", "s", [cold["restart_s"]]),
        Result.of(NAME, f"restart ({what})", "s", [r["restart_s"] for r in warm]),
        Result.of(NAME, "controller RSS growth after restart", "MiB", [r["rss_growth"] / 2**20 for r in warm]),
        Result.of(NAME, "list page of 100 (JSON)", "KiB", [r["page_bytes"] / 1024 for r in warm]),
        Result.of(NAME, "get one finished profile in full", "ms", [r["get_s"] * 1e3 for r in warm]),
    ]
