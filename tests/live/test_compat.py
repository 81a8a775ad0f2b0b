"""Our output loads as is in TensorBoard's PyTorch profiler plugin and in HTA."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator.models.requests import ProfileState
from tests.support.common import LIVE_TARGET, wait_for
from tests.support.hta_apart import hta

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def profile_dir(live_job, tmp_path_factory) -> Path:
    """One finished 2-rank profile of the live job, in cluster storage."""
    from orchestrator import ProfilingClient

    root = tmp_path_factory.mktemp("compat") / "store"
    manifest = ProfilingClient.in_cluster(storage=str(root)).profile(LIVE_TARGET, steps=2).wait(timeout=180)
    assert manifest.status == ProfileState.DONE
    return root / LIVE_TARGET / manifest.profile_id


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_tensorboard_plugin_lists_the_profile_with_one_worker_per_rank(profile_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logdir = profile_dir.parent
    tb = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/pytorch_profiler"
    run = f"{profile_dir.name}/traces"

    def loaded():
        try:
            body = _get_json(f"{base}/runs")
        except OSError:
            return None
        return body if run in body["runs"] and not body["loading"] else None

    try:
        wait_for(loaded, timeout=90, what="tensorboard to load the run")
        workers = _get_json(f"{base}/workers?run={run}&view=Overview")
    finally:
        tb.terminate()
        tb.wait(10)

    assert sorted(w.split(".")[0] for w in workers) == ["rank0", "rank1"]


def test_hta_loads_every_rank_with_the_window_steps(profile_dir):
    manifest = json.loads((profile_dir / "manifest.json").read_text())
    window = {f"ProfilerStep#{n}" for n in range(manifest["start_step"], manifest["stop_step"])}
    loaded = hta("steps", profile_dir / "traces")

    assert sorted(loaded) == ["0", "1"]
    for rank in ("0", "1"):
        # HTA trims at most the last iteration; every other step of the window is there, on every rank.
        steps = set(loaded[rank])
        last = f"ProfilerStep#{manifest['stop_step'] - 1}"
        assert window - {last} <= steps <= window
