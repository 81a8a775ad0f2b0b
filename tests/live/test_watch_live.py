"""A watch on a real job with a planted slowdown (a local Ray cluster): exactly one profile,
none before the slowdown, none during the cooldown, and the profile shows the longer step."""

from __future__ import annotations

import statistics
import subprocess
import time
from datetime import timedelta

import pytest

from orchestrator.cli.example_job import ExampleJob
from orchestrator.models.requests import ProfileState
from tests.support.common import LIVE_TARGET, RAYPROF_CLI

pytestmark = [pytest.mark.integration, pytest.mark.extended]

SLOW_FROM = 300


def test_a_slowdown_takes_exactly_one_profile_within_a_minute(ray_cluster, client, tmp_path):
    args = ["--workers", "2", "--slow-from-step", str(SLOW_FROM), "--slowdown", "1.5"]
    job = ExampleJob(ray_cluster, "slow-run", tmp_path / "slow-run.log", *args)
    timeline: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        timeline.append(f"{time.monotonic() - t0:6.1f}s  {what}")

    try:
        job.wait_until_training(client, min_step=1, timeout=300)
        created = subprocess.run(
            [RAYPROF_CLI, "watch", "slow-run", "--slower-than", "1.3", "--for", "10s", "--then-profile", "5",
             "--baseline", "60s", "--cooldown", "10m", "--in-cluster", "--address", ray_cluster],
            capture_output=True, text=True, timeout=120,
        )
        assert created.returncode == 0, created.stderr
        watch_id = created.stdout.split()[0]
        note(f"watch created: {created.stdout.strip()}")
        slow_seen = fired = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            target = next(t for t in client.targets() if t.name == "slow-run")
            step = min(r.step for r in target.ranks)
            profiles = [p for p in client.list(target="slow-run").profiles if p.kind == "profile"]
            if slow_seen is None and step >= SLOW_FROM:
                slow_seen = time.monotonic()
                note(f"slowdown reached (step {step}, median step {1000 * target.median_step_time_s:.0f} ms)")
            if profiles and fired is None:
                fired = time.monotonic()
                note(f"profile {profiles[0].id} taken at step {step}: {profiles[0].trigger.detail}")
                assert slow_seen is not None, "a profile before the slowdown"
                break
            time.sleep(1.0)
        assert fired is not None, f"no profile within the deadline; timeline: {timeline}"
        manifest = client.get(profiles[0].id).wait(timeout=180)
        note(f"profile {manifest.status.value}, steps {manifest.start_step}..{manifest.stop_step - 1}")
        cooldown_until = time.monotonic() + 10
        while time.monotonic() < cooldown_until:
            time.sleep(2.0)
        after = [p for p in client.list(target="slow-run").profiles if p.kind == "profile"]
        watch = client.get_watch(watch_id)
        note(f"{len(after)} profile(s) after 10 s more of slow steps; watch {watch.state}")
        client.delete_watch(watch_id)
    finally:
        job.stop()
        print("\nwatch timeline:\n" + "\n".join(timeline))
    assert fired - slow_seen < 60
    assert len(after) == 1 and watch.state == "COOLDOWN"
    assert manifest.status == ProfileState.DONE
    trigger = manifest.trigger
    assert trigger is not None and trigger.watch_id == watch_id
    assert manifest.start_step >= SLOW_FROM
    step_ms = statistics.median(d for r in manifest.ranks for d in r.step_durations_ms)
    note_ms = f"profiled median step {step_ms:.0f} ms vs baseline {1000 * trigger.baseline:.0f} ms"
    print(note_ms)
    assert step_ms > 1.3 * 1000 * trigger.baseline


def test_a_schedule_profiles_a_live_job_now_and_a_minute_later_and_the_two_diff(ray_cluster, live_job, client):
    created = subprocess.run(
        [RAYPROF_CLI, "watch", LIVE_TARGET, "--every", "1m", "--then-profile", "3", "--cooldown", "1m",
         "--max-per-hour", "60", "--in-cluster", "--address", ray_cluster],
        capture_output=True, text=True, timeout=120,
    )
    assert created.returncode == 0, created.stderr
    watch_id = created.stdout.split()[0]
    try:
        deadline = time.monotonic() + 150
        watch = client.get_watch(watch_id)
        while len(watch.firings) < 2 and time.monotonic() < deadline:
            time.sleep(2.0)
            watch = client.get_watch(watch_id)
    finally:
        client.delete_watch(watch_id)
    assert len(watch.firings) == 2, f"firings: {watch.firings}"
    first, second = watch.firings
    spacing = (second.at - first.at).total_seconds()
    print(f"\nscheduled firings {spacing:.1f}s apart: {first.profile_id}, {second.profile_id}")
    assert 60 <= spacing < 90 and first.at - watch.created_at < timedelta(seconds=5)
    manifests = [client.get(f.profile_id).wait(timeout=180) for f in watch.firings]
    for manifest in manifests:
        assert manifest.status == ProfileState.DONE
        assert manifest.trigger.kind == "schedule" and manifest.trigger.watch_id == watch_id
    # The history a long job keeps: two scheduled profiles of the same job, compared.
    diff = client.diff(first.profile_id, second.profile_id)
    print(f"diff comparable={diff.comparable} {diff.not_comparable} {diff.claims}")
    assert (diff.a.profile_id, diff.b.profile_id) == (first.profile_id, second.profile_id)
    assert diff.a.ranks == diff.b.ranks == [0, 1] and len(diff.a.steps) == len(diff.b.steps) == 3
