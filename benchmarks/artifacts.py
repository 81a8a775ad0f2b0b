"""Artifacts: how many bytes a profiled step costs, and how fast they upload.

Sizes come from real windows (``benchmarks.window.run_window``: SmallResNet,
batch 32, CPU activity) per option set: the uploaded ``.pt.trace.json.gz`` and
its raw size (gunzipped, i.e. what ``export_chrome_trace`` wrote), divided by
the window's steps. One rank's numbers; every rank writes its own.

Throughput is ``Storage.put_file`` (sha256 + upload, what an agent's export
thread calls) of 1, 16 (= the multipart threshold; boto3 goes multipart at
``size >= threshold``) and 64 MiB files to a local S3 server (moto, in its own
process on 127.0.0.1 so it does not share our GIL) and to cluster storage
(``FileStorage`` in a temp folder, with its fsync).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import LogFn
from benchmarks._stats import Result
from benchmarks.window import OPTION_SETS, RUN_CACHE, collect_runs

NAME = "artifacts"
MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 server in a child process on 127.0.0.1, with one bucket."""

    def __init__(self, bucket: str = "rayprof-bench") -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        self.bucket = bucket
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto S3 server did not start") from None
                time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _sizes(quick: bool, log: LogFn) -> list[Result]:
    trials, steps = (1, 3) if quick else (3, 5)
    # Reuse the windows the window benchmark just ran, if it ran in this process.
    runs = list(RUN_CACHE) or collect_runs(quick, log, trials=trials, steps=steps)
    steps = runs[0].steps
    results: list[Result] = []
    for name in OPTION_SETS:
        mine = [r for r in runs if r.options == name and r.artifacts]
        if not mine:
            results.append(Result(f"{NAME}[{name}]", "sizes", "", None, note="no DONE window"))
            continue

        def kind_bytes(kind: str, mine: list = mine) -> list[float]:
            return [sum(a["bytes"] for a in r.artifacts if a["kind"] == kind) for r in mine]

        raw = [r.trace_raw_bytes / r.steps / 1024 for r in mine]
        gz = [b / r.steps / 1024 for b, r in zip(kind_bytes("trace"), mine)]
        ratio = [r.trace_raw_bytes / b for b, r in zip(kind_bytes("trace"), mine)]
        bench = f"{NAME}[{name}]"
        results += [
            Result.of(bench, "trace raw per profiled step", "KiB", raw,
                      note=f"{len(mine)} windows x {steps} steps, one rank; SmallResNet batch 32, CPU activity"
                      if name == "default" else ""),
            Result.of(bench, "trace gzip per profiled step", "KiB", gz),
            Result.of(bench, "gzip ratio raw/gz", "x", ratio),
            Result.of(bench, "op table csv per window", "KiB", [b / 1024 for b in kind_bytes("op_table")]),
        ]
        if OPTION_SETS[name].get("profile_memory"):
            results.append(Result.of(bench, "memory timeline gz per profiled step", "KiB",
                                     [b / r.steps / 1024 for b, r in zip(kind_bytes("memory_timeline"), mine)]))
        total = [sum(a["bytes"] for a in r.artifacts) / r.steps / 1024 for r in mine]
        results.append(Result.of(bench, "all artifacts per profiled step (stored)", "KiB", total))
    return results


def _throughput(quick: bool, log: LogFn) -> list[Result]:
    from orchestrator.storage import FileStorage, S3Storage

    sizes_mib = (1, 16) if quick else (1, 16, 64)
    trials = 2 if quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="rayprof-bench-upload-"))
    s3 = MotoS3()
    results: list[Result] = []
    try:
        backends = {
            "s3 (moto, 127.0.0.1)": S3Storage(s3.bucket, "bench", endpoint_url=s3.endpoint),
            "cluster storage (FileStorage)": FileStorage(tmp / "store"),
        }
        files = {}
        for mib in sizes_mib:
            path = tmp / f"blob-{mib}"
            # Incompressible, like an already-gzipped trace.
            with open(path, "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(MIB))
            files[mib] = path
        speeds: dict[tuple[str, int], list[float]] = {}
        # Interleave sizes and backends inside each trial so drift hits all alike.
        for t in range(trials):
            for mib in sizes_mib:
                for label, storage in backends.items():
                    key = f"bench/{uuid.uuid4().hex}/blob-{mib}"
                    t0 = time.perf_counter()
                    storage.put_file(files[mib], key, "trace")
                    dt = time.perf_counter() - t0
                    speeds.setdefault((label, mib), []).append(mib * MIB / 1e6 / dt)
                    storage.delete(key)  # keep moto's memory and /tmp flat
            log(f"{NAME}: upload trial {t + 1}/{trials}: " + ", ".join(
                f"{lbl.split()[0]} {m}MiB {v[-1]:.0f} MB/s" for (lbl, m), v in speeds.items()))
        for (label, mib), v in speeds.items():
            note = ""
            if mib >= 16 and label.startswith("s3"):
                note = "multipart (boto3 TransferConfig threshold = chunk = 16 MiB)"
            results.append(Result.of(f"{NAME} upload", f"{label}, {mib} MiB", "MB/s", v, note=note))
    finally:
        s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def run(quick: bool, log: LogFn) -> list[Result]:
    """Artifact sizes per option set and upload throughput."""
    return _sizes(quick, log) + _throughput(quick, log)




