"""``rayprof demo`` end to end: its own Ray cluster, so it runs as a subprocess.

In ``make test`` (README promises that a fresh clone's ``make demo`` works): ~50 s alone, ~90 s beside
the session's job. How long it took is printed, never asserted; the subprocess's timeout bounds it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.analysis.finding_base import verdict
from orchestrator.analysis.step_content import one_step
from orchestrator.models.profile import Manifest
from tests.support.common import RAYPROF_CLI
from tests.support.serve_fixtures import artifact_problems, free_port

pytestmark = [pytest.mark.integration]

DEMO_TIMEOUT_S = 480.0


def test_demo_profiles_the_example_job_over_http_and_shuts_down(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    result = subprocess.run(
        [RAYPROF_CLI, "demo", "--dir", str(tmp_path / "demo"), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    elapsed = time.monotonic() - started
    print(f"rayprof demo took {elapsed:.0f}s")

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (manifest_path,) = (tmp_path / "demo" / "store" / "rayprof-demo").glob("*/manifest.json")
    manifest = Manifest.model_validate_json(manifest_path.read_text())
    assert manifest.status == "DONE" and [r.rank for r in manifest.ranks] == [0, 1]
    assert artifact_problems(manifest_path.parent, manifest) == []
    assert f"tensorboard --logdir {manifest_path.parent / 'traces'}" in result.stdout
    # The analysis as `rayprof report` prints it: what a step is, the verdict in one line, the findings.
    step = one_step(manifest.summary, manifest)
    assert step is not None and step.startswith("One step") and step in result.stdout
    findings = manifest.summary.findings
    assert all(f.title in result.stdout for f in findings)
    assert f"verdict: {verdict(manifest.summary)}" in result.stdout
    # Each rank's agent timed its training thread (for the straggler finding) and its process's garbage collections
    # (for the collector's) over the window, under Ray Train.
    for rank in manifest.summary.ranks:
        assert rank.thread_time is not None and 0 < rank.thread_time.cpu_s <= rank.thread_time.wall_s
        assert rank.gc is not None and rank.gc.enabled and rank.gc.thresholds[0] > 0
    # Shut down cleanly: the training driver is gone, and Ray says nothing failed on the way out (serve.shutdown()
    # before ray.shutdown() made the raylet print a failed ServeController.graceful_shutdown, "killed by ray.kill").
    assert (tmp_path / "demo" / "train.stop").exists()
    assert "killed by `ray.kill`" not in result.stdout + result.stderr
    assert "training finished" in Path(tmp_path / "demo" / "train.log").read_text()
