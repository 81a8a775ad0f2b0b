"""Profiling a live TorchTrainer job end to end on a real local Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import (
    ConflictError,
    InvalidRequestError,
    ProfileState,
    RankState,
    TargetNotFoundError,
)
from orchestrator.cli.example_job import ExampleJob
from orchestrator.manifest import read_manifest, verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.storage import open_storage
from tests.support.common import LIVE_TARGET, wait_for
from tests.support.tracefiles import has_input_shapes, load_trace, profiler_steps

pytestmark = pytest.mark.integration


def _traces(folder: Path) -> dict[int, dict]:
    traces = {}
    for path in sorted((folder / "traces").glob("rank*.pt.trace.json.gz")):
        trace = load_trace(path)
        traces[trace["distributedInfo"]["rank"]] = trace
    return traces


def test_window_covers_the_same_steps_on_every_rank(live_job, file_store, tmp_path):
    manifest = file_store.client.profile(LIVE_TARGET, steps=3).wait(timeout=120)

    assert manifest.status == ProfileState.DONE
    assert [r.rank for r in manifest.ranks] == [0, 1]
    window = list(range(manifest.start_step, manifest.start_step + 3))
    for rank in manifest.ranks:
        assert rank.state == RankState.DONE
        assert (rank.first_step, rank.last_step) == (window[0], window[-1])
        assert len(rank.step_durations_ms) == 3
    traces = _traces(Path(file_store.root) / LIVE_TARGET / manifest.profile_id)
    assert sorted(traces) == [0, 1]
    for trace in traces.values():
        assert profiler_steps(trace) == window
        assert trace["distributedInfo"]["world_size"] == 2


def test_every_listed_artifact_exists_with_matching_checksum(live_job, file_store):
    manifest = file_store.client.profile(LIVE_TARGET, steps=2, profile_memory=True).wait(timeout=120)

    storage = open_storage(StorageSpec(uri=file_store.root))
    kinds = sorted(a.kind for r in manifest.ranks for a in r.artifacts)
    assert kinds == ["memory_timeline"] * 2 + ["op_table"] * 2 + ["trace"] * 2
    assert verify_manifest(storage, manifest) == []
    assert read_manifest(storage, LIVE_TARGET, manifest.profile_id) == manifest


def test_the_report_draws_each_ranks_memory_timeline(live_job, file_store):
    manifest = file_store.client.profile(LIVE_TARGET, steps=2, profile_memory=True).wait(timeout=120)

    storage = open_storage(StorageSpec(uri=file_store.root))
    report = next(a for a in manifest.artifacts if a.kind == "report")
    html = storage.get_bytes(f"{LIVE_TARGET}/{manifest.profile_id}/{report.key}").decode()
    assert '<section id="memory"><h2>Memory timeline</h2>' in html
    assert "memory of rank 0 on cpu" in html and "memory of rank 1 on cpu" in html
    assert "https://ui.perfetto.dev" in html


def test_profile_is_collected_to_s3(live_job, s3_store, s3_server, tmp_path):
    handle = s3_store.client.profile(LIVE_TARGET, steps=2)
    manifest = handle.wait(timeout=120)

    assert manifest.status == ProfileState.DONE
    assert manifest.storage_uri.startswith(s3_store.root)
    storage = open_storage(StorageSpec(uri=s3_store.root, s3_endpoint_url=s3_server.endpoint_url))
    assert verify_manifest(storage, manifest) == []
    local = handle.download(tmp_path / "dl")
    assert sorted(_traces(local)) == [0, 1]
    assert (local / "manifest.json").is_file()


def test_two_windows_in_a_row_profile_later_steps(live_job, file_store):
    first = file_store.client.profile(LIVE_TARGET, steps=2).wait(timeout=120)
    second = file_store.client.profile(LIVE_TARGET, steps=2).wait(timeout=120)

    assert first.status == second.status == ProfileState.DONE
    assert second.start_step >= first.stop_step
    assert second.profile_id != first.profile_id
    for rank in second.ranks:
        assert (rank.first_step, rank.last_step) == (second.start_step, second.start_step + 1)


def test_job_started_only_with_the_setup_hook_registers_every_rank(live_job, client):
    # live_job passes the hook through runtime_env and never imports rayprof.
    (target,) = [t for t in client.targets() if t.name == LIVE_TARGET]
    assert target.world_size == 2
    assert [r.info.world_rank for r in target.ranks] == [0, 1]
    assert all(r.step > 0 for r in target.ranks)


def test_shapes_are_recorded_only_when_asked(live_job, file_store):
    plain = file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120)
    shaped = file_store.client.profile(LIVE_TARGET, steps=1, record_shapes=True).wait(timeout=120)

    root = Path(file_store.root) / LIVE_TARGET
    assert not has_input_shapes(_traces(root / plain.profile_id)[0])
    assert has_input_shapes(_traces(root / shaped.profile_id)[0])


def test_rank_subset_profiles_only_those_ranks(live_job, file_store):
    manifest = file_store.client.profile(LIVE_TARGET, steps=1, ranks=[1]).wait(timeout=120)

    assert manifest.status == ProfileState.DONE
    assert [r.rank for r in manifest.ranks] == [1]
    assert list(_traces(Path(file_store.root) / LIVE_TARGET / manifest.profile_id)) == [1]


def test_second_request_while_one_runs_is_a_conflict(live_job, file_store):
    handle = file_store.client.profile(LIVE_TARGET, steps=5)
    with pytest.raises(ConflictError, match="already running"):
        file_store.client.profile(LIVE_TARGET, steps=1)
    assert handle.wait(timeout=120).status == ProfileState.DONE


def test_queued_request_runs_after_the_current_one(live_job, file_store):
    first = file_store.client.profile(LIVE_TARGET, steps=2)
    second = file_store.client.profile(LIVE_TARGET, steps=2, queue=True)

    m1, m2 = first.wait(timeout=120), second.wait(timeout=120)
    assert m1.status == m2.status == ProfileState.DONE
    assert m2.start_step >= m1.stop_step


def test_cancel_while_armed_ends_cancelled_without_traces(live_job, file_store):
    handle = file_store.client.profile(LIVE_TARGET, steps=40)
    handle.cancel()
    manifest = handle.wait(timeout=120)

    assert manifest.status == ProfileState.CANCELLED
    assert all(r.state == RankState.CANCELLED for r in manifest.ranks)
    assert manifest.all_artifacts() == []


def test_cancel_while_capturing_stops_the_profilers(live_job, file_store, client):
    handle = file_store.client.profile(LIVE_TARGET, steps=50)
    wait_for(lambda: handle.status().state == ProfileState.CAPTURING, timeout=60, interval=0.05, what="capture")
    handle.cancel()
    manifest = handle.wait(timeout=120)

    assert manifest.status == ProfileState.CANCELLED
    assert {r.state for r in manifest.ranks} == {RankState.CANCELLED}
    assert manifest.all_artifacts() == []
    # No profiler left running on the workers: the next window works.
    assert file_store.client.profile(LIVE_TARGET, steps=1).wait(timeout=120).status == ProfileState.DONE


def test_unknown_target_is_rejected(client):
    with pytest.raises(TargetNotFoundError, match="no-such-run"):
        client.profile("no-such-run", steps=1)


def test_rank_that_does_not_exist_is_rejected(live_job, client):
    with pytest.raises(InvalidRequestError, match=r"ranks \[5\] do not exist"):
        client.profile(LIVE_TARGET, steps=1, ranks=[0, 5])


def test_steps_over_the_maximum_are_rejected(live_job, client):
    with pytest.raises(InvalidRequestError, match="over the maximum"):
        client.profile(LIVE_TARGET, steps=10_000)


@pytest.mark.extended
def test_attached_job_with_explicit_steps_is_profiled(ray_cluster, client, file_store, tmp_path):
    job = ExampleJob(
        ray_cluster, "attach-run", tmp_path / "attach-run.log", "--instrument", "attach", "--step-mode", "explicit"
    )
    try:
        job.wait_until_training(client)
        manifest = file_store.client.profile("attach-run", steps=2).wait(timeout=120)
    finally:
        job.stop()

    assert manifest.status == ProfileState.DONE
    traces = _traces(Path(file_store.root) / "attach-run" / manifest.profile_id)
    assert [profiler_steps(t) for t in traces.values()] == [[manifest.start_step, manifest.start_step + 1]] * 2
