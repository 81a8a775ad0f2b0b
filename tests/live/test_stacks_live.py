"""Stacks, stall and lag on real jobs with planted faults (a local Ray cluster).

The stall settings are small so a planted hang turns STALLED in seconds;
they are set at import, before the session's control actor is created.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from orchestrator.cli.example_job import ExampleJob, stop_all
from tests.support.common import RAYPROF_CLI, wait_for

pytestmark = pytest.mark.integration

os.environ.setdefault("RAYPROF_STALL_MIN_S", "8")
os.environ.setdefault("RAYPROF_STALL_STEP_FACTOR", "20")

HANG_AT = 40


def _cli(ray_cluster: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAYPROF_CLI, *args, "--in-cluster", "--address", ray_cluster],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def fault_jobs(ray_cluster, tmp_path_factory):
    """Both planted-fault jobs, started together so their start-up (Ray Train, torch, gloo) overlaps.

    hang-run: rank 1 sleeps forever in its train loop at step 40; rank 0 blocks in all_reduce.
    lag-run: no DDP, rank 1 sleeps 0.25 s more per step, so it falls steadily behind.
    """
    logs = tmp_path_factory.mktemp("faults")
    hang = ["--workers", "2", "--hang-rank", "1", "--hang-at-step", str(HANG_AT), "--flight-recorder", "2000"]
    lag = ["--workers", "2", "--no-ddp", "--slow-rank", "1", "--slow-rank-delay-s", "0.25"]
    jobs = {
        "hang-run": ExampleJob(ray_cluster, "hang-run", logs / "hang-run.log", *hang),
        "lag-run": ExampleJob(ray_cluster, "lag-run", logs / "lag-run.log", *lag),
    }
    try:
        yield jobs
    finally:
        stop_all(list(jobs.values()), timeout=5)


@pytest.fixture(scope="module")
def hung_job(fault_jobs, client):
    fault_jobs["hang-run"].wait_until_training(client, min_step=1, timeout=300)
    return fault_jobs["hang-run"]


def _target(client, name):
    return next((t for t in client.targets() if t.name == name), None)


def test_stacks_name_the_hung_rank_and_its_frame_and_the_target_turns_stalled(ray_cluster, client, hung_job):
    wait_for(
        lambda: (t := _target(client, "hang-run")) is not None and min(r.step for r in t.ranks) >= HANG_AT,
        timeout=120,
        what="both ranks at the hang",
    )
    started = time.monotonic()
    done = _cli(ray_cluster, "stacks", "hang-run")
    took = time.monotonic() - started
    print(f"\n$ rayprof stacks hang-run   ({took:.1f}s)\n{done.stdout}{done.stderr[-2000:]}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("rank 1 is in train_job.py:") and "in _planted_hang;" in lines[1]
    assert "rank 0 waits in all_reduce (distributed_c10d.py:" in lines[1] and "in train_loop" in lines[1]
    assert "rank 1 never joined it" in done.stdout
    # Both ranks answered from their agents' own threads while training is blocked (a rank that did
    # not answer within the per-rank timeout would be named here), whatever the machine's speed.
    assert "did not answer" not in done.stdout and "no rank answered" not in done.stdout

    target = wait_for(
        lambda: (t := _target(client, "hang-run")) is not None and t.health == "STALLED" and t.stall_stacks and t,
        timeout=60,
        what="STALLED with stacks",
    )
    time.sleep(5)
    automatic = [p for p in client.list(target="hang-run").profiles if p.kind == "stacks" and p.trigger is not None]
    assert [p.id for p in automatic] == [target.stall_stacks]
    assert automatic[0].trigger.kind == "stalled"
    assert target.stall_verdict is not None and "rank 0 waits in all_reduce (distributed_c10d.py:" in target.stall_verdict
    print(f"stalled: {target.stalled_s:.0f}s (threshold {target.stall_threshold_s:.0f}s); stacks {target.stall_stacks}")


def test_the_stacks_taken_on_stall_are_read_back_by_report_and_named_by_status(ray_cluster, client, hung_job):
    target = wait_for(
        lambda: (t := _target(client, "hang-run")) is not None and t.health == "STALLED" and t.stall_stacks and t,
        timeout=120,
        what="STALLED with stacks",
    )
    bundle = target.stall_stacks
    report = _cli(ray_cluster, "report", bundle)
    status = _cli(ray_cluster, "status", bundle)

    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"{bundle}  target hang-run  DONE"
    assert lines[1].startswith("rank 1 is in train_job.py:") and "in _planted_hang;" in lines[1]
    assert 'in _planted_hang' in report.stdout and "File " in report.stdout  # the grouped frames themselves
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split() == ["rank", "host", "state", "uploaded", "reason"]  # no steps column
    assert f"stacks: rayprof report {bundle}" in status.stdout


def test_a_rank_that_falls_behind_is_named_in_targets(ray_cluster, client, fault_jobs):
    fault_jobs["lag-run"].wait_until_training(client, min_step=1, timeout=300)
    target = wait_for(
        lambda: (t := _target(client, "lag-run")) is not None and t.lagging_ranks and t, timeout=60, what="a lag"
    )
    shown = _cli(ray_cluster, "targets")
    print(f"\n$ rayprof targets\n{shown.stdout}")
    assert target.lagging_ranks == [1]
    assert target.ranks[1].steps_behind >= 3
    row = next(line for line in shown.stdout.splitlines() if line.startswith("lag-run"))
    assert "1 (-" in row
