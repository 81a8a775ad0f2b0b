"""Names the tests share that are not fixtures: the checkout, the CLI, the live job's name, S3 targets, waiting."""

from __future__ import annotations

import io
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The console script installed beside the interpreter running the tests.
RAYPROF_CLI = str(Path(sys.executable).with_name("rayprof"))
LIVE_TARGET = "live-run"
# The session's live job runs until the session ends; this bound outlasts any live run CI allows (45 minutes).
LIVE_JOB_MAX_S = 3600.0
# Small enough that a long window with every option passes it, large enough
# for every other test's windows (default options write ~160 KiB per step).
MAX_TRACE_BYTES = 16 * 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Where the session cluster's node serves its Prometheus metrics (tests/live/test_telemetry_live.py reads them).
METRICS_EXPORT_PORT = _free_port()


@dataclass(frozen=True)
class S3Target:
    endpoint_url: str
    bucket: str


@dataclass
class RestartableS3:
    """A second endpoint over the same in-process moto buckets, that a test stops and starts again."""

    port: int
    bucket: str
    running: object = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.running = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.running.start()


@dataclass
class StoreClient:
    """A client whose controller writes to ``root`` (a folder or an s3:// URI)."""

    client: object
    root: str


def wait_for(predicate, *, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value, bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def cli_results(command: Callable[..., object], *args: object) -> tuple[object, str]:
    """What ``command(*args)`` returns and the result lines it prints (the CLI's results stream, as a command prints
    them), without running the whole CLI."""
    from orchestrator.cli.output import set_results

    printed = io.StringIO()
    previous = set_results(printed)
    try:
        returned = command(*args)
    finally:
        set_results(previous)
    return returned, printed.getvalue()
