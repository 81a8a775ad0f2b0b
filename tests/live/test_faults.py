"""Faults on the real local cluster: training never breaks, nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid

import httpx
import pytest
import ray

from actors.controller.handle import find_controller
from orchestrator import ProfileState, ProfilingClient, RankState, RayprofError
from orchestrator.build import BEFORE_BUILD_IDS, build_id
from orchestrator.cli.example_job import ExampleJob
from orchestrator.errors import ControllerBuildMismatchError
from orchestrator.layout import index_key, state_key
from orchestrator.manifest import verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.settings import CONTROLLER_NAME, CONTROLLER_NAMESPACE
from orchestrator.storage import open_storage
from tests.support.common import LIVE_TARGET, MAX_TRACE_BYTES, wait_for
from tests.support.tracefiles import load_trace, profiler_steps

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.serve_fixtures"]


def _ranks(client, target: str):
    return {r.info.world_rank: r for t in client.targets() if t.name == target for r in t.ranks}


def _wait_state(handle, *states, timeout: float = 60.0):
    return wait_for(lambda: handle.status().state in states, timeout=timeout, interval=0.05, what=f"state {states}")


@pytest.mark.extended  # a job of its own, killed and restarted: ~75 s
def test_killed_worker_is_marked_failed_and_the_restarted_group_is_profiled(ray_cluster, client, file_store, tmp_path):
    job = ExampleJob(ray_cluster, "fault-run", tmp_path / "fault-run.log", "--max-failures", "2")
    try:
        job.wait_until_training(client)
        before = {rank: w.info.pid for rank, w in _ranks(client, "fault-run").items()}
        handle = file_store.client.profile("fault-run", steps=50)
        _wait_state(handle, ProfileState.CAPTURING)
        os.kill(before[1], signal.SIGKILL)
        manifest = handle.wait(timeout=120)

        assert manifest.status in (ProfileState.PARTIAL, ProfileState.FAILED)
        killed = manifest.ranks[1]
        assert killed.state == RankState.FAILED
        assert "stopped responding" in killed.reason or "replaced" in killed.reason
        for rank in manifest.ranks:
            assert rank.state == RankState.DONE or rank.reason
        assert verify_manifest(open_storage(StorageSpec(uri=file_store.root)), manifest) == []

        def restarted():
            ranks = _ranks(client, "fault-run")
            fresh = len(ranks) == 2 and all(w.info.pid not in before.values() for w in ranks.values())
            return fresh and min(w.step for w in ranks.values()) >= 3

        wait_for(restarted, timeout=240, what="the worker group to restart and re-register")
        again = file_store.client.profile("fault-run", steps=2).wait(timeout=120)
        assert again.status == ProfileState.DONE
        assert {r.pid for r in again.ranks}.isdisjoint(before.values())
    finally:
        job.stop()


def _controller_pid() -> int | None:
    try:
        return ray.get(find_controller().__ray_call__.remote(lambda self: os.getpid()), timeout=10)
    except Exception:
        return None


def _wait_for_a_new_controller(before: int | None) -> None:
    wait_for(lambda: _controller_pid() not in (None, before), timeout=60, what="the controller to restart")


def _restart_controller() -> None:
    """Kill the control actor and wait until Ray has brought up a new one."""
    before = _controller_pid()
    ray.kill(find_controller(), no_restart=False)
    _wait_for_a_new_controller(before)


def test_controller_restart_recovers_an_in_flight_profile(live_job, file_store):
    handle = file_store.client.profile(LIVE_TARGET, steps=40)
    _wait_state(handle, ProfileState.CAPTURING)
    _restart_controller()
    manifest = handle.wait(timeout=180)

    assert manifest.status == ProfileState.DONE
    assert [r.state for r in manifest.ranks] == [RankState.DONE, RankState.DONE]
    assert verify_manifest(open_storage(StorageSpec(uri=file_store.root)), manifest) == []
    # Agents re-registered by themselves: a new profile works.
    assert file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120).status == ProfileState.DONE


def test_controller_restart_keeps_finished_profiles(live_job, file_store):
    done = file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120)
    _restart_controller()

    restored = file_store.client.get(done.profile_id)
    assert restored.last_status.state == ProfileState.DONE
    assert restored.manifest() == done


@ray.remote(num_cpus=0)
class _OlderRelease:
    """A control actor of a rayprof release before build ids, as far as this test reaches it: ``ping`` answers as
    those did. Agents and relays that call it get an error for every other method, and keep retrying."""

    async def ping(self) -> str:
        return BEFORE_BUILD_IDS


def test_a_controller_of_an_older_release_is_refused_then_replaced(live_job, client, service, file_store):
    done = file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120)
    # The services deployed before (their replicas hold the old actor's handle) are asked once first.
    urls = [service.url, service.secure_url]
    assert [httpx.get(f"{url}/healthz", timeout=30).status_code for url in urls] == [200, 200]
    # An upgrade leaves the detached controller running the code it started with. Stand in for an older release's:
    # kill this one for good and start, under its name, an actor that answers ping as older releases did.
    ray.kill(find_controller(), no_restart=True)
    wait_for(lambda: find_controller() is None, timeout=60, what="the controller's name to be free")
    older = _OlderRelease.options(name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE, lifetime="detached").remote()
    assert ray.get(older.ping.remote(), timeout=60) == BEFORE_BUILD_IDS

    with pytest.raises(ControllerBuildMismatchError, match="from before build ids"):
        ProfilingClient.in_cluster()
    # Started with the storage the first one was (the session's default): its saved state comes back.
    replaced = ProfilingClient.in_cluster(replace_controller=True)

    assert replaced.get(done.profile_id).manifest() == done
    assert replaced.profile(LIVE_TARGET, steps=1).wait(timeout=120).status == ProfileState.DONE
    # A client made before the replacement follows the controller's name to the new actor, as do the services'
    # reads (their next write finds the new actor too).
    assert LIVE_TARGET in {t.name for t in client.targets()}
    assert [httpx.get(f"{url}/healthz", timeout=30).json()["build"] for url in urls] == [build_id(), build_id()]


def test_controller_that_died_after_writing_the_manifest_finishes_the_profile_on_restart(live_job, file_store):
    done = file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120)
    home = open_storage(StorageSpec(uri=os.environ["RAYPROF_STORAGE"]))
    cluster = ray.get(find_controller().config.remote(), timeout=30).cluster_name
    before = _controller_pid()
    assert before is not None
    # Stopped, the controller writes nothing more: a running one saves its index whenever any profile's
    # post-window check ends, putting back the entry the edits below take out (CI saw it once); then it
    # dies as in a crash.
    os.kill(before, signal.SIGSTOP)
    try:
        # What a crash between the manifest (the commit point) and the final state save leaves behind.
        key = state_key(cluster, done.profile_id)
        saved = json.loads(home.get_bytes(key))
        saved.update(state=ProfileState.COLLECTING.value, manifest_uri=None, finished_at=None)
        home.put_state(json.dumps(saved).encode(), key)
        # The index of finished profiles is written after the final state save: the crash left it out.
        index = json.loads(home.get_bytes(index_key(cluster)))
        index["profiles"] = [e for e in index["profiles"] if e["summary"]["id"] != done.profile_id]
        home.put_state(json.dumps(index).encode(), index_key(cluster))
    finally:
        os.kill(before, signal.SIGKILL)
    _wait_for_a_new_controller(before)

    restored = file_store.client.get(done.profile_id)
    assert restored.last_status.state == ProfileState.DONE
    assert restored.manifest() == done
    assert file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120).status == ProfileState.DONE


def test_request_right_after_a_controller_restart_waits_for_every_rank(live_job, file_store):
    _restart_controller()
    manifest = file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120)

    assert [(r.rank, r.state) for r in manifest.ranks] == [(0, RankState.DONE), (1, RankState.DONE)]


@pytest.fixture
def flaky_s3(s3_server, ray_cluster):
    """A second S3 endpoint, backed by the same buckets, that tests can stop and restart."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)]
    servers[0].start()

    class Flaky:
        endpoint = f"http://127.0.0.1:{port}"
        bucket = s3_server.bucket

        def stop(self):
            servers[-1].stop()

        def start(self):
            servers.append(ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False))
            servers[-1].start()

    yield Flaky()
    servers[-1].stop()


def test_upload_rides_out_a_short_storage_outage(live_job, flaky_s3):
    uri = f"s3://{flaky_s3.bucket}/outage-{uuid.uuid4().hex[:8]}"
    client = ProfilingClient.in_cluster(storage=uri, s3_endpoint_url=flaky_s3.endpoint)
    flaky_s3.stop()
    handle = client.profile(LIVE_TARGET, steps=2)
    wait_for(
        lambda: any(r.state == RankState.UPLOADING for r in handle.status().ranks),
        timeout=60, interval=0.05, what="upload to start",
    )
    flaky_s3.start()
    manifest = handle.wait(timeout=120)

    assert manifest.status == ProfileState.DONE, [(r.rank, r.state.value, r.reason) for r in manifest.ranks]
    storage = open_storage(StorageSpec(uri=uri, s3_endpoint_url=flaky_s3.endpoint))
    assert verify_manifest(storage, manifest) == []


@pytest.mark.extended  # every upload retried to its last attempt: ~60 s
def test_storage_that_never_returns_fails_the_ranks_and_training_goes_on(live_job, flaky_s3):
    uri = f"s3://{flaky_s3.bucket}/down-{uuid.uuid4().hex[:8]}"
    client = ProfilingClient.in_cluster(storage=uri, s3_endpoint_url=flaky_s3.endpoint)
    flaky_s3.stop()
    steps_before = min(w.step for w in _ranks(client, LIVE_TARGET).values())
    handle = client.profile(LIVE_TARGET, steps=2)
    with pytest.raises(RayprofError, match="without a manifest"):
        handle.wait(timeout=120)

    status = handle.status()
    assert status.state == ProfileState.FAILED
    assert "could not write the manifest" in status.reason
    for rank in status.ranks:
        assert rank.state == RankState.FAILED
        assert "export/upload failed" in rank.reason and "attempts" in rank.reason
        assert rank.artifacts == []
    assert min(w.step for w in _ranks(client, LIVE_TARGET).values()) > steps_before + 2
    flaky_s3.start()


@pytest.mark.extended
def test_job_that_finishes_during_a_window_ends_the_request_with_a_reason(ray_cluster, client, file_store, tmp_path):
    job = ExampleJob(ray_cluster, "ending-run", tmp_path / "ending-run.log")
    job.wait_until_training(client)
    handle = file_store.client.profile("ending-run", steps=50)
    _wait_state(handle, ProfileState.CAPTURING)
    job.stop()
    manifest = handle.wait(timeout=120)

    assert manifest.status == ProfileState.FAILED
    assert all(r.state == RankState.FAILED and "stopped responding" in r.reason for r in manifest.ranks)
    # The run finished and Ray Train killed its workers: said in Ray's words, not as a host cut off.
    assert all("Ray holds its actor dead" in r.reason and "ray.kill" in r.reason for r in manifest.ranks), manifest.ranks
    assert manifest.all_artifacts() == []


# Every option on: 1.0-1.35 MB of raw trace per step and rank (1.35 in a CI rehearsal, whose 25 steps made 33.8 MB,
# over twice the tests' 16 MiB cap), so 18 steps pass the cap and stay under twice it for anything from 0.93 to
# 1.86 MB a step. activities=["cpu"] keys these windows apart from other tests' all-option windows, whose sizes the
# controller learns from.
BIG_STEPS = 18
BIG_OPTIONS = dict(activities=["cpu"], record_shapes=True, profile_memory=True, with_stack=True, with_modules=True)


@pytest.fixture(scope="module")
def oversized(live_job, tmp_path_factory):
    """The first window over the byte cap, then a second one just like it."""
    root = tmp_path_factory.mktemp("oversized")
    client = ProfilingClient.in_cluster(storage=str(root))
    first = client.profile(LIVE_TARGET, steps=BIG_STEPS, **BIG_OPTIONS).wait(timeout=180)
    second = client.profile(LIVE_TARGET, steps=BIG_STEPS, **BIG_OPTIONS).wait(timeout=180)
    return root, first, second


def test_trace_over_the_byte_cap_keeps_the_leading_steps_that_fit(oversized):
    root, first, _ = oversized

    assert first.status == ProfileState.PARTIAL, first.reason
    assert "cut their trace at the byte cap" in first.reason
    assert verify_manifest(open_storage(StorageSpec(uri=str(root))), first) == []
    for rank in first.ranks:
        assert rank.state == RankState.DONE
        assert rank.trace_bytes > MAX_TRACE_BYTES
        assert rank.first_step == first.start_step and rank.last_step < first.stop_step - 1
        assert rank.reason.startswith(f"trace cut to steps {first.start_step}..{rank.last_step}")
        (trace,) = [a for a in rank.artifacts if a.kind == "trace"]
        kept = load_trace(root / LIVE_TARGET / first.profile_id / trace.key)
        assert profiler_steps(kept) == list(range(rank.first_step, rank.last_step + 1))


def test_window_like_one_over_the_cap_is_planned_shorter(oversized):
    _, first, second = oversized
    per_step = max(r.trace_bytes for r in first.ranks) / BIG_STEPS

    assert second.status == ProfileState.PARTIAL, second.reason
    assert f"window shortened from {BIG_STEPS} to" in second.reason
    planned = second.stop_step - second.start_step
    assert 1 <= planned <= MAX_TRACE_BYTES / per_step
    for rank in second.ranks:
        assert rank.state == RankState.DONE
        assert (rank.first_step, rank.last_step) == (second.start_step, second.stop_step - 1)
