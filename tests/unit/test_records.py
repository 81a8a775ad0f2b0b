"""One record per profile: the controller's record, its saved status, its list summary and its
manifest carry every field they share, and a manifest's summary is typed by its kind (old
stacks manifests on disk included). No Ray, no controller."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from pydantic import ValidationError

from actors.controller.profiles.state import Profile, Window
from orchestrator.layout import profile_uri
from orchestrator.manifest import read_manifest
from orchestrator.models.agent_protocol import StorageSpec, WorkerInfo
from orchestrator.models.analysis import Summary
from orchestrator.models.common import utcnow
from orchestrator.models.post_window import PostWindowCheck
from orchestrator.models.profile import (
    Artifact,
    Manifest,
    PostprocessProgress,
    ProfileStatus,
    RankEvent,
    RankResult,
    StacksSummary,
    Trigger,
)
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.models.summaries import ProfileSummary
from orchestrator.storage import open_storage

_ARTIFACT = Artifact(kind="trace", key="traces/rank0.h.1.pt.trace.json.gz", uri="file:///x", bytes=3, sha256="0" * 64)


def _ended_profile() -> Profile:
    """A profile with every field the records share set to something other than its default."""
    t0 = utcnow()
    profile = Profile(
        id="prof-20240101-000000-0123abcd",
        request=ProfileRequest(target="run", steps=3, warmup=2),
        storage=StorageSpec(uri="file:///store"),
        run="raysubmit_1",
        state=ProfileState.PARTIAL,
        reason="ranks [1] did not complete",
        window=Window(10, 3),
        manifest_uri="file:///store/run/prof-20240101-000000-0123abcd/manifest.json",
        ranks={
            1: RankResult(rank=1, state=RankState.FAILED, reason="gone"),
            0: RankResult(rank=0, state=RankState.DONE, first_step=10, last_step=12, artifacts=[_ARTIFACT]),
        },
        created_at=t0,
        scheduled_at=t0 + timedelta(seconds=1),
        capture_started_at=t0 + timedelta(seconds=2),
        finished_at=t0 + timedelta(seconds=3),
        trigger=Trigger(kind="stalled", at=t0, detail="no step for 60 s"),
        postprocess=PostprocessProgress(phase="merging", done=1, total=2),
        post_window=PostWindowCheck(threshold=1.2, steps=3, verdict="ok", detail="as before"),
    )
    return profile


def test_the_saved_status_restores_the_same_record():
    profile = _ended_profile()
    status = profile.snapshot()
    assert status.start_step == 10 and status.stop_step == 13 and [r.rank for r in status.ranks] == [0, 1]
    # The saved state file is the record's own JSON.
    restored = Profile.model_validate_json(profile.model_dump_json()).snapshot()
    # The postprocess's progress is not carried over a restart: a restored profile runs it again.
    assert restored == status.model_copy(update={"postprocess": None})


def test_every_field_a_status_and_its_list_summary_share_is_carried():
    profile = _ended_profile()
    status, summary = profile.snapshot(), profile.summary()
    for name in ProfileSummary.model_fields.keys() & ProfileStatus.model_fields.keys():
        assert getattr(summary, name) == getattr(status, name), name
    assert summary.steps == 3 and summary.rank_states == {RankState.DONE: 1, RankState.FAILED: 1}


def test_a_manifest_is_made_from_the_ended_record():
    profile = _ended_profile()
    manifest = profile.manifest_of(ProfileState.PARTIAL, profile.reason, cluster={"ray": "2"})
    status = profile.snapshot()
    for name in Manifest.model_fields.keys() & ProfileStatus.model_fields.keys() - {"reason"}:
        assert getattr(manifest, name) == getattr(status, name), name
    assert (manifest.profile_id, manifest.requested_at) == (profile.id, profile.created_at)
    assert manifest.cluster == {"ray": "2"} and manifest.summary is None and manifest.artifacts == []


def test_a_final_event_carries_everything_it_shares_with_the_rank_result():
    event = RankEvent(
        profile_id="p",
        agent_id="a",
        state=RankState.DONE,
        first_step=4,
        last_step=6,
        step_durations_ms=[1.0, 2.0],
        base_time_ns=7,
        trace_bytes=9,
        artifacts=[_ARTIFACT],
        missed_start=True,
    )
    result = RankResult(rank=0, state=RankState.CAPTURING).model_copy(update=event.outcome())
    for name in RankEvent.model_fields.keys() & RankResult.model_fields.keys() - {"state", "reason"}:
        assert getattr(result, name) == getattr(event, name), name


def test_a_waiting_rank_says_who_it_is():
    info = WorkerInfo(
        agent_id="a", target="run", world_rank=3, world_size=4, local_rank=1, node_rank=0,
        node_id="n1", host="h1", pid=42, device="cuda:1", torch_version="2.5",
    )  # fmt: skip
    result = RankResult.waiting(info)
    assert result == RankResult(
        rank=3, local_rank=1, node_id="n1", host="h1", pid=42, device="cuda:1", state=RankState.WAITING
    )


def test_a_new_profiles_folder_uri_comes_from_its_storage_target_and_id():
    profile = Profile(id="prof-1", request=ProfileRequest(target="run", steps=2), storage=StorageSpec(uri="s3://b/p/"))
    assert profile.storage_uri == "s3://b/p/run/prof-1" == profile_uri("s3://b/p", "run", "prof-1")


def _stacks_manifest(summary: object) -> dict:
    return {
        "profile_id": "stk-20240101-000000-0123abcd",
        "kind": "stacks",
        "target": "run",
        "status": "DONE",
        "request": {"target": "run", "steps": 1},
        "storage_uri": "file:///store/run/stk-20240101-000000-0123abcd",
        "start_step": None,
        "stop_step": None,
        "ranks": [],
        "requested_at": "2024-01-01T00:00:00Z",
        "finished_at": "2024-01-01T00:00:01Z",
        "summary": summary,
    }


def test_a_stacks_manifest_written_before_the_typed_summary_still_loads(tmp_path):
    # A folder kept from an older rayprof: its summary is {"stacks": line}.
    folder = tmp_path / "run" / "stk-20240101-000000-0123abcd"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(_stacks_manifest({"stacks": "ranks 0–7 wait in all_reduce"})))
    manifest = read_manifest(open_storage(StorageSpec(uri=tmp_path.as_uri())), "run", folder.name)
    assert manifest.summary == StacksSummary(line="ranks 0–7 wait in all_reduce")


def test_a_manifests_summary_must_be_of_its_kind():
    stacks = StacksSummary(line="all alike", groups=1)
    analysis = Summary(source="x", world_size=1, steps=[], ranks=[])
    assert Manifest.model_validate(_stacks_manifest(stacks.model_dump())).summary == stacks
    with pytest.raises(ValidationError, match="kind 'stacks'"):
        Manifest.model_validate(_stacks_manifest(analysis.model_dump()))
    with pytest.raises(ValidationError, match="kind 'profile'"):
        Manifest.model_validate({**_stacks_manifest(stacks.model_dump()), "kind": "profile"})
    profile = Manifest.model_validate({**_stacks_manifest(analysis.model_dump(mode="json")), "kind": "profile"})
    assert profile.summary == analysis


def test_a_bundle_saved_with_the_old_invented_request_loads_without_one():
    # Bundles written before they were their own kind carry {"target", "steps": 1}: dropped on load.
    manifest = Manifest.model_validate(_stacks_manifest({"line": "all alike"}))
    assert manifest.request is None
    saved = {**_stacks_manifest(None), "id": "stk-1", "state": "DONE", "created_at": "2024-01-01T00:00:00Z"}
    status = ProfileStatus.model_validate({k: v for k, v in saved.items() if k in ProfileStatus.model_fields})
    assert status.request is None and status.target == "run"


def test_a_profile_needs_its_request_and_a_bundle_has_none():
    without = {k: v for k, v in _stacks_manifest({"line": "x"}).items() if k != "request"}
    with pytest.raises(ValidationError, match="a profile has a request"):
        Manifest.model_validate({**without, "kind": "profile", "summary": None})
    assert Manifest.model_validate(without).request is None
