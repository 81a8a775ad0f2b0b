"""``rayprof demo``: the whole path on one machine, in a few minutes, with nothing to set up.

Starts a local Ray cluster on loopback, launches the example training job
(``deploy/examples/train_job.py``, instrumented only through the
``worker_process_setup_hook``), deploys the HTTP service, profiles the job
over HTTP with :class:`~orchestrator.client.ProfilingClient`, prints where
everything landed, and shuts it all down. Profiles go to a local folder
(``./rayprof-demo/store``), so no S3 is needed.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from orchestrator.cli.example_job import TRAIN_JOB, ExampleJob
from orchestrator.cli.output import print_analysis
from orchestrator.cli.progress import ProgressPrinter, current_steps_lookup, format_size
from orchestrator.client import ProfilingClient
from orchestrator.errors import RayprofError
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.requests import ProfileState
from orchestrator.settings import DISCOVERY_INTERVAL_S_ENV_VAR, POLL_TIMEOUT_S_ENV_VAR

__all__ = ["DEMO_TARGET", "run_demo"]

DEMO_TARGET = "rayprof-demo"
MIN_STEP_BEFORE_PROFILING = 3


def _say(message: str) -> None:
    print(f"rayprof demo: {message}", flush=True)


def _free_port(preferred: int) -> int:
    """``preferred`` if nothing listens on it, else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


class _CaptureClock:
    """Progress printing that also notes when the profile first reports CAPTURING."""

    def __init__(self, printer: ProgressPrinter) -> None:
        self._printer = printer
        self.capturing_at: float | None = None

    def __call__(self, status: ProfileStatus) -> None:
        if self.capturing_at is None and status.state in (ProfileState.CAPTURING, ProfileState.COLLECTING):
            self.capturing_at = time.monotonic()
        self._printer(status)


def _print_result(manifest: Manifest, elapsed_s: float, capture_latency_s: float | None, url: str) -> None:
    folder = _local_path(manifest.storage_uri)
    latency = f", capturing {capture_latency_s:.1f}s after the request" if capture_latency_s is not None else ""
    print()
    _say(f"profile {manifest.profile_id} of {manifest.target}: {manifest.status.value} in {elapsed_s:.1f}s{latency}")
    if manifest.reason:
        print(f"  reason:    {manifest.reason}")
    print(f"  service:   {url} (POST /v1/profiles, GET /v1/profiles/{manifest.profile_id})")
    print(f"  window:    steps {manifest.start_step}..{(manifest.stop_step or 1) - 1}")
    for rank in manifest.ranks:
        print(
            f"  rank {rank.rank}:    {rank.state.value} steps {rank.first_step}..{rank.last_step} "
            f"on {rank.host} pid {rank.pid}" + (f" ({rank.reason})" if rank.reason else "")
        )
    for artifact in manifest.all_artifacts():
        print(f"    {artifact.key:<58} {format_size(artifact.bytes):>10}")
    if folder is not None:
        print(f"  manifest:  {folder / 'manifest.json'}")
        print(f"  traces:    {folder / 'traces'}")
        print(f"  view:      tensorboard --logdir {folder / 'traces'}")
        print(f"  analyse:   rayprof analyze {folder}")
    report = next((a for a in manifest.artifacts if a.kind == "report"), None)
    report_at = (folder / report.key if folder is not None else report.uri) if report is not None else None
    print()
    if isinstance(manifest.summary, Summary):
        # What `rayprof report` prints for the same profile: the step, its phases, the device's idle
        # causes and the findings (or that none crossed a threshold).
        print_analysis(manifest.summary, report_at, manifest)
    else:
        print(f"no analysis in the manifest; report: {report_at}")


def run_demo(*, workdir: Path, port: int = 8000, steps: int = 5, workers: int = 2, timeout_s: float = 600.0) -> int:
    """Run the demo end to end; returns 0 when the profile ends DONE, 1 otherwise."""
    # Before Ray starts, so every Ray process inherits them: loopback only, and
    # agents that find the controller and notice a window within a second or two.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(DISCOVERY_INTERVAL_S_ENV_VAR, "0.5")
    os.environ.setdefault(POLL_TIMEOUT_S_ENV_VAR, "5")
    import ray
    from ray import serve

    from orchestrator.service.app import build_app

    if not TRAIN_JOB.is_file():
        _say(f"cannot find the example job at {TRAIN_JOB}; run the demo from a source checkout (`make demo`)")
        return 1
    started = time.monotonic()
    deadline = started + timeout_s
    workdir = workdir.resolve()
    store = workdir / "store"
    store.mkdir(parents=True, exist_ok=True)
    port = _free_port(port)
    url = f"http://127.0.0.1:{port}"
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    _say("starting a local Ray cluster (loopback only)")
    # address="local": always a fresh cluster, even when RAY_ADDRESS names another one.
    context = ray.init(
        address="local",
        num_cpus=workers + 2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        namespace="rayprof-demo",
    )
    training: ExampleJob | None = None
    try:
        _say(f"launching the example training job {DEMO_TARGET!r} on {workers} workers (setup hook only)")
        training = ExampleJob(
            context.address_info["gcs_address"],
            DEMO_TARGET,
            workdir / "train.log",
            "--workers", str(workers), "--instrument", "setup-hook", "--storage-path", str(workdir / "train"),
            max_seconds=timeout_s,
        )
        _say(f"deploying the rayprof service at {url} (profiles go to {store})")
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
        serve.run(build_app({"storage": str(store)}), name="rayprof", route_prefix="/")
        client = ProfilingClient(url)

        _say("waiting for the job's ranks to register")
        target = training.wait_until_training(
            client, ranks=workers, min_step=MIN_STEP_BEFORE_PROFILING, timeout=deadline - time.monotonic()
        )
        _say(
            f"{target.name}: {len(target.ranks)} ranks at step {min(w.step for w in target.ranks)}; "
            f'POST /v1/profiles {{"target": "{target.name}", "steps": {steps}, "profile_memory": true}}'
        )
        posted = time.monotonic()
        # No record_shapes: it holds each op's tensors until the window closes, and the window's steps ran 3-6x the
        # job's (the report's first note said so); the memory timeline needs profile_memory alone.
        handle = client.profile(DEMO_TARGET, steps, profile_memory=True)
        clock = _CaptureClock(ProgressPrinter(current_steps_lookup(client), stream=sys.stdout))
        manifest = handle.wait(timeout=max(1.0, deadline - time.monotonic()), progress=clock)
        latency = clock.capturing_at - posted if clock.capturing_at is not None else None
        _print_result(manifest, time.monotonic() - posted, latency, url)
        ok = manifest.status == ProfileState.DONE
    except (RayprofError, RuntimeError, TimeoutError) as e:
        _say(f"failed: {e}")
        ok = False
    finally:
        _say("shutting down (training job, service, cluster)")
        if training is not None:
            training.stop()
        # The cluster is this process's own (address="local"): ray.shutdown() stops Serve with it. serve.shutdown()
        # first made the raylet print a failed ServeController.graceful_shutdown task ("killed by ray.kill").
        ray.shutdown()
    _say(f"{'done' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s; files in {workdir}")
    return 0 if ok else 1
