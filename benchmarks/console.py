"""The console's Profiles page with 1,000 stored profiles x 64 ranks, in a real headless Chromium.

A controller actor restores 1,000 saved profiles of 64 ranks each (as a
cluster at the default ``RAYPROF_RETENTION_COUNT`` holds them); the real
Serve app serves the console. Per trial, a fresh browser context opens
``/#/profiles`` and the clock stops when the first page's rows are in the
table: the load time a user sees. Also: bytes of the list response the page
fetches (``GET /v1/profiles?limit=50``). Target: under a second (issue 14).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import LogFn
from benchmarks._stats import Result, ensure_ray
from benchmarks._stored import CLUSTER, write_saved_profiles

NAME = "console"
CHROMIUM = "/usr/bin/chromium"
# The console's PAGE_SIZE (orchestrator/service/console/app.js).
PAGE_SIZE = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _page_loads(url: str, trials: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    seconds = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(trials):
                context = browser.new_context()
                tab = context.new_page()
                t0 = time.perf_counter()
                tab.goto(f"{url}/#/profiles")
                tab.locator(f"main table tbody tr >> nth={PAGE_SIZE - 1}").wait_for(timeout=120_000)
                seconds.append(time.perf_counter() - t0)
                context.close()
        finally:
            browser.close()
    return seconds


def run(quick: bool, log: LogFn) -> list[Result]:
    """1,000 profiles x 64 ranks (100 x 16 with --quick); 5 page loads (2 with --quick)."""
    import ray
    from ray import serve

    from actors.controller.actor import Controller
    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec
    from orchestrator.service.app import ProfilingService

    count, ranks, trials = (100, 16, 2) if quick else (1000, 64, 5)
    root = Path(tempfile.mkdtemp(prefix="rayprof-bench-console-"))
    ensure_ray()
    controller = None
    try:
        write_saved_profiles(StorageSpec(uri=str(root)), count, ranks)
        config = controller_config(StorageSpec(uri=str(root))).model_copy(update={"cluster_name": CLUSTER})
        controller = ray.remote(Controller).options(num_cpus=0).remote(config)
        t0 = time.monotonic()
        ray.get(controller.ping.remote(), timeout=300)
        log(f"controller restored {count} profiles x {ranks} ranks in {time.monotonic() - t0:.1f}s")
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ProfilingService.bind(controller=controller), name="rayprof-bench-console", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        sizes = [len(httpx.get(f"{url}/v1/profiles", params={"limit": PAGE_SIZE}, timeout=120).content)
                 for _ in range(3)]
        loads = _page_loads(url, trials)
        log(f"list response {sizes[0]:,} bytes; page loads {[round(s, 3) for s in loads]} s")
    finally:
        serve.shutdown()
        if controller is not None:
            ray.kill(controller, no_restart=True)
        shutil.rmtree(root, ignore_errors=True)
    what = f"{count} profiles x {ranks} ranks"
    return [
        Result.of(NAME, f"Profiles page load, first {PAGE_SIZE} rows shown ({what})", "s", loads,
                  target="< 1 s", met=sorted(loads)[len(loads) // 2] < 1.0),
        Result.of(NAME, f"list response, {PAGE_SIZE} profiles", "KiB", [s / 1024 for s in sizes]),
    ]
