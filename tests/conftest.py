"""Shared fixtures: a real local Ray cluster on loopback, a real S3 server, a live training job.

Environment for a real MinIO instead of moto's server (all four must be set):
  RAYPROF_TEST_S3_ENDPOINT_URL   e.g. http://127.0.0.1:9000
  RAYPROF_TEST_S3_BUCKET         an existing bucket the keys can write
  AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from orchestrator.cli.example_job import ExampleJob
from orchestrator.models.agent_protocol import StorageSpec
from tests.support.common import (
    LIVE_JOB_MAX_S,
    LIVE_TARGET,
    MAX_TRACE_BYTES,
    METRICS_EXPORT_PORT,
    RestartableS3,
    S3Target,
    StoreClient,
)

# Set before Ray starts so every Ray process inherits them: loopback only,
# fast heartbeats so tests notice vanished workers in seconds.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAYPROF_POLL_TIMEOUT_S", "2")
os.environ.setdefault("RAYPROF_WORKER_EXPIRY_GRACE_S", "4")
os.environ.setdefault("RAYPROF_DISCOVERY_INTERVAL_S", "0.5")
os.environ.setdefault("RAYPROF_REQUEST_TIMEOUT_S", "120")
# `rayprof report ID` keeps what it downloads in a cache (10 profiles at most): not the home of whoever runs the tests.
os.environ.setdefault("RAYPROF_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rayprof-test-report-cache"))
# An ended run's gauges leave Ray's endpoint within a test's wait (the recorder is replaced every 20 s).
os.environ.setdefault("RAYPROF_METRICS_ENDED_KEPT_S", "5")
os.environ.setdefault("RAYPROF_MAX_TRACE_BYTES", str(MAX_TRACE_BYTES))
# Ray's metrics agent drops the series of a process that stopped reporting after this long (its
# default 120 s; processes report every 10 s): on Ray 2.43 an ended run's gauges go only so (the
# recorder process that set them is replaced), and the test of it waited minutes for Ray's default.
os.environ.setdefault("RAY_WORKER_TIMEOUT_S", "30")


# A property test asserts behaviour, never speed: no example fails for taking long on a loaded machine.
settings.register_profile("rayprof", deadline=None)
settings.load_profile("rayprof")


# The order of the live tests. Those that start a cluster of their own (`ray start`, marked own_cluster)
# run before the session's cluster starts: their `ray stop` would stop it (tests/support/own_cluster.py).
# Then those that need no session cluster (the demo's own, the wheel's venv): on cores nothing else uses.
# Then the tests that use the session's live job: it trains flat out on both cores for as long as it
# runs, and a job started beside it took ~1.8x as long (the demo: ~50 s alone, ~90 s beside it). It stops
# once the last of them is done, and the tests with jobs of their own start those on idle cores.
_live = pytest.StashKey[list[ExampleJob]]()
_last_live_user = pytest.StashKey[str]()


def _uses_live_job(item: pytest.Item) -> bool:
    return "live_job" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: file order within each group.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("own_cluster") is None,
            "ray_cluster" in getattr(item, "fixturenames", ()),
            not _uses_live_job(item),
        )
    )
    users = [item for item in items if _uses_live_job(item)]
    config.stash[_live] = []
    if users:
        config.stash[_last_live_user] = users[-1].nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if item.nodeid == item.config.stash.get(_last_live_user, None):
        for job in item.config.stash.get(_live, []):
            job.stop()


@pytest.fixture
def home(tmp_path: Path) -> StorageSpec:
    """A fresh cluster-storage root for a controller driven without Ray (tests/support/fake_agents.py)."""
    return StorageSpec(uri=str(tmp_path / "store"))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Target]:
    """moto's threaded S3 server on 127.0.0.1, or a real MinIO named by env vars."""
    endpoint = os.environ.get("RAYPROF_TEST_S3_ENDPOINT_URL")
    if endpoint:
        yield S3Target(endpoint, os.environ["RAYPROF_TEST_S3_BUCKET"])
        return
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    bucket = "rayprof-test"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield S3Target(endpoint, bucket)
    server.stop()


@pytest.fixture
def restartable_s3(s3_server: S3Target) -> Iterator[RestartableS3]:
    """moto's S3 on a port of its own, backed by ``s3_server``'s buckets (moto keeps them per process):
    ``stop()`` is an outage every call sees (connection refused), ``start()`` ends it."""
    if os.environ.get("RAYPROF_TEST_S3_ENDPOINT_URL"):
        pytest.skip("stopping the S3 server needs moto's in-process server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    s3 = RestartableS3(port, s3_server.bucket)
    s3.start()
    yield s3
    s3.stop()


@pytest.fixture(scope="session")
def ray_cluster(s3_server: S3Target, tmp_path_factory) -> Iterator[str]:
    """A local Ray cluster on loopback; returns its GCS address.

    Starts after the S3 fixture so workers inherit its credentials.
    """
    import ray

    os.environ.setdefault("RAYPROF_STORAGE", str(tmp_path_factory.mktemp("default-store")))
    ctx = ray.init(
        # Logical CPUs: Ray Train v1 (the default up to Ray 2.50) holds one more CPU per job for its
        # trainable, and the stacks tests run three 2-rank jobs beside the Serve replicas at once.
        num_cpus=16,
        include_dashboard=False,
        log_to_driver=False,
        namespace="rayprof-tests",
        _metrics_export_port=METRICS_EXPORT_PORT,
    )
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


@pytest.fixture(scope="session")
def client(ray_cluster: str):
    """An in-cluster ProfilingClient (creates the control actor)."""
    from orchestrator import ProfilingClient

    return ProfilingClient.in_cluster()


@pytest.fixture(scope="session")
def live_job(ray_cluster: str, client, tmp_path_factory, request: pytest.FixtureRequest) -> Iterator[ExampleJob]:
    """The long-running job most tests profile: 2 CPU workers, instrumented
    only through the runtime_env setup hook (no code change), polling through a
    relay on their node as large jobs do (jobs of their own poll directly). Stopped after its last user."""
    log = tmp_path_factory.mktemp("jobs") / f"{LIVE_TARGET}.log"
    # It lives as long as the session: its stop file ends it at teardown. The time bound only reaps a job that a
    # killed pytest leaves behind, so it must outlast the slowest live run: the 1,500 s default ran out 25 minutes
    # into a 37-minute one (2026-11-30) and the last tests found no 'live-run'.
    job = ExampleJob(ray_cluster, LIVE_TARGET, log, "--instrument", "setup-hook", "--relay", max_seconds=LIVE_JOB_MAX_S)
    request.config.stash[_live].append(job)
    try:
        job.wait_until_training(client)
        yield job
    finally:
        job.stop()


@pytest.fixture
def file_store(ray_cluster: str, tmp_path: Path) -> StoreClient:
    """The controller writes this test's profiles to a fresh cluster-storage folder."""
    from orchestrator import ProfilingClient

    root = tmp_path / "store"
    return StoreClient(ProfilingClient.in_cluster(storage=str(root)), str(root))


@pytest.fixture
def s3_store(ray_cluster: str, s3_server: S3Target) -> StoreClient:
    """The controller writes this test's profiles to a fresh prefix of the S3 test bucket."""
    from orchestrator import ProfilingClient

    uri = f"s3://{s3_server.bucket}/run-{uuid.uuid4().hex[:8]}"
    return StoreClient(ProfilingClient.in_cluster(storage=uri, s3_endpoint_url=s3_server.endpoint_url), uri)
