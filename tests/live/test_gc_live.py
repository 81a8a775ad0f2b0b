"""Live: a Ray Train job whose loop calls gc.collect() every step is told so, on every rank, with the line that calls
it. The agent's collector watch runs in each worker under Ray Train (registered for the window only), and the time the
collections take is theirs, not the host's Python (which once named the watch's own callback as the loop's code)."""

from __future__ import annotations

import re

import pytest

from orchestrator.cli.example_job import ExampleJob, stop_all
from orchestrator.models.analysis import Summary
from orchestrator.models.requests import ProfileState

pytestmark = pytest.mark.integration

TARGET = "gc-collect"


@pytest.fixture(scope="module")
def collecting_job(ray_cluster, client, tmp_path_factory):
    # 100,000 records of a dict and a list each: with torch and Ray's own objects, a full collection walks ~1 M
    # objects, tens of ms a step on either rank.
    log = tmp_path_factory.mktemp("gc") / f"{TARGET}.log"
    job = ExampleJob(ray_cluster, TARGET, log, "--gc-collect-objects", "100000")
    try:
        job.wait_until_training(client, min_step=2, timeout=300)
        yield job
    finally:
        stop_all([job])


def test_a_loop_calling_gc_collect_every_step_is_told_so_with_the_line_that_calls_it(collecting_job, file_store):
    manifest = file_store.client.profile(TARGET, steps=4).wait(timeout=180)
    assert manifest.status == ProfileState.DONE, manifest.reason
    summary = Summary.model_validate(manifest.summary)

    first = next(f for f in summary.findings if f.code != "cores_shared")  # the host's load is told on its own
    assert first.code == "gc_pause" and first.title.startswith("The loop calls gc.collect() every step, up to "), first
    assert re.match(r"train_loop \(\S*train_job\.py:\d+\) calls gc\.collect\(\) every step on ranks 0, 1: ", first.evidence), first.evidence
    for rank in summary.ranks:
        assert rank.gc is not None
        explicit = [c for c in rank.gc.collections if c.explicit]
        assert len(explicit) >= len(summary.steps) and {c.generation for c in explicit} == {2}
    # The pauses are the collector's: no finding names the agent's own code as the loop's.
    assert not any("actors/agent" in f.evidence + f.fix for f in summary.findings)
