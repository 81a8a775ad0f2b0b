"""The agent under the Ray Train this release does not run by default: v1 where v2 is the default
(``RAY_TRAIN_V2_ENABLED=0``, Ray 2.51 on), v2 where v1 is (``=1``, 2.43-2.50; 2.40 has v1 only: skipped).

The session's live job runs on the default; this one, instrumented the same way (the setup hook
only), runs on the other, so `make test` and `make test-oldest-ray` cover both at both ends.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.cli.example_job import ExampleJob
from orchestrator.models.requests import ProfileState
from orchestrator.ray_compat import has_train_v2, train_v2_enabled

pytestmark = pytest.mark.integration

TARGET = "other-train-run"


@pytest.fixture(scope="module")
def other_train_job(ray_cluster, client, tmp_path_factory):
    v2 = not train_v2_enabled()
    if v2 and not has_train_v2():
        pytest.skip("this Ray release has Ray Train v1 only, which the session's live job runs on")
    logs = tmp_path_factory.mktemp("train-version")
    # Set on the driver, as Ray's docs say: Ray Train carries it to its workers itself.
    env = {**os.environ, "RAY_TRAIN_V2_ENABLED": "1" if v2 else "0"}
    job = ExampleJob(
        ray_cluster, TARGET, logs / f"{TARGET}.log", "--storage-path", str(logs / "train"), env=env
    )
    try:
        job.wait_until_training(client)
        yield job, v2, logs / "train"
    finally:
        job.stop()


def test_a_hook_only_job_on_the_other_ray_train_is_profiled_to_done(other_train_job, file_store):
    job, v2, train_storage = other_train_job
    manifest = file_store.client.profile(TARGET, steps=2).wait(timeout=180)

    assert manifest.status == ProfileState.DONE, (v2, manifest.reason)
    assert sorted(r.rank for r in manifest.ranks) == [0, 1]
    assert all(r.state == "DONE" for r in manifest.ranks)
    # The Train context calls the agent makes answered: the run's folder under the job's storage path.
    assert manifest.cluster["world_size"] == 2
    [path] = manifest.cluster["experiment_paths"]
    assert path.startswith(str(train_storage)), path
    job.check_alive()
