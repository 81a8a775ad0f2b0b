"""Analysis on profiles of real jobs with planted bottlenecks."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.example_job import ExampleJob, stop_all
from orchestrator.models.analysis import Summary
from orchestrator.models.requests import ProfileState
from tests.support.common import LIVE_TARGET
from tests.support.tracefiles import load_trace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def planted_jobs(ray_cluster, client, tmp_path_factory):
    """A data-loading-bound job and a job whose rank 1 is slow, started together."""
    logs = tmp_path_factory.mktemp("planted")
    jobs = {
        "slow-data": ExampleJob(ray_cluster, "slow-data", logs / "slow-data.log", "--data-delay-s", "0.004"),
        "straggler": ExampleJob(
            ray_cluster, "straggler", logs / "straggler.log", "--slow-rank", "1", "--slow-rank-delay-s", "0.15"
        ),
    }
    try:
        for job in jobs.values():
            job.wait_until_training(client, min_step=2, timeout=300)
        yield jobs
    finally:
        stop_all(list(jobs.values()))


def _summary(store, target: str, steps: int = 3) -> Summary:
    manifest = store.client.profile(target, steps=steps).wait(timeout=180)
    assert manifest.status == ProfileState.DONE, manifest.reason
    assert manifest.analysis_error is None
    return Summary.model_validate(manifest.summary)


def test_manifest_lists_the_merged_trace_and_report(live_job, file_store):
    manifest = file_store.client.profile(LIVE_TARGET, steps=2).wait(timeout=180)

    folder = Path(file_store.root) / LIVE_TARGET / manifest.profile_id
    assert sorted(a.kind for a in manifest.artifacts) == ["merged_trace", "report"]
    merged = load_trace(folder / "merged.trace.json.gz")
    names = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert {"rank 0 (vm)", "rank 1 (vm)"} <= {n.replace(manifest.ranks[0].host, "vm") for n in names}
    assert "<h2>Findings</h2>" in (folder / "report.html").read_text()
    summary = Summary.model_validate(manifest.summary)
    assert [r.rank for r in summary.ranks] == [0, 1]
    assert summary.steps == [manifest.start_step, manifest.start_step + 1]
    assert Summary.model_validate_json(manifest.summary.model_dump_json()) == summary
    # The per-rank Ray tasks' merge: its budget and each rank's clock alignment are in the manifest.
    assert manifest.merge is not None and manifest.merge.ranks == [0, 1]
    assert [a.rank for a in manifest.merge.alignment] == [0, 1] and manifest.merge.events > 0


def test_each_rank_s_trace_carries_its_pace_just_before_the_window(live_job, file_store):
    # The agent's heartbeats measure it (actors/agent/pace.py); the analysis reads it back beside the window's steps.
    summary = _summary(file_store, LIVE_TARGET, steps=2)

    for rank in summary.ranks:
        assert rank.steps_before is not None, f"rank {rank.rank}: no pace before the window in its trace"
        assert rank.steps_before.span_s >= 1.0 and rank.steps_before.steps >= 1
        assert rank.steps_before.options == []


# Before the planted jobs start (their module fixture starts at first use):
# two extra jobs on 2 cores would make any job look unhealthy.
def test_healthy_job_gets_no_warning(live_job, file_store):
    # Past start-up, and over enough steps that a few descheduled ones stay noise.
    live_job.wait_until_training(file_store.client, min_step=100, timeout=120)
    # Two ranks on two shared cores: what the scheduler moves between them is told as neither a straggler nor an
    # imbalance (tests/unit/test_analysis_scheduler_noise.py), but another process can still hold one rank back for
    # a whole window, a real straggler while it lasts, so allow up to three. Info lines are allowed: the policy in
    # docs/results.md keeps a one-step cause (a collector's pause) below a warning. A CI machine whose other work
    # holds the ranks off their cores half the step is told so (cores_shared): true of the host, not of the job.
    for _ in range(3):
        summary = _summary(file_store, LIVE_TARGET, steps=20)
        warnings = [
            f"{f.code}: {f.evidence}" for f in summary.findings if f.severity == "warning" and f.code != "cores_shared"
        ]
        if not warnings:
            break

    assert warnings == []
    assert summary.stragglers == []


def test_dataloader_bound_job_is_named(planted_jobs, file_store):
    # Four training processes share two cores here: a window where one rank's compute
    # was descheduled long enough to dilute its data share is noise, so allow three.
    for _ in range(3):
        summary = _summary(file_store, "slow-data", steps=6)
        codes = {f.code: f for f in summary.findings}
        if "dataloader_bound" in codes and codes["dataloader_bound"].ranks == [0, 1]:
            break

    assert "dataloader_bound" in codes, [f.title for f in summary.findings]
    assert codes["dataloader_bound"].ranks == [0, 1]
    assert "num_workers" in codes["dataloader_bound"].fix


def test_straggler_rank_and_what_it_runs_are_named(planted_jobs, file_store):
    # Rank 1 sleeps in its training loop after the forward: the loop's own code, which the stack samples name (it
    # read as a slow forward before the samples were read).
    summary = _summary(file_store, "straggler")

    assert [s.rank for s in summary.stragglers] == [1]
    assert summary.stragglers[0].phase == "other"
    (finding,) = [f for f in summary.findings if f.code == "straggler"]
    assert finding.ranks == [1]
    assert "in the loop's own Python, which the other ranks do not run:" in finding.evidence
    assert "in train_loop (train_job.py:" in finding.evidence and "runs on rank 1 alone" in finding.fix
