"""Saved profiles written straight into a controller's home storage, as a long-running cluster leaves them.

Shared by the ``restart`` and ``console`` benchmarks and the console's browser
test: each profile is a finished window of ``ranks`` ranks, each rank with a
trace, an op table and its step times, saved where the controller keeps state.
"""

from __future__ import annotations

import json
from datetime import timedelta

from orchestrator.layout import MANIFEST_NAME, profile_prefix, rank_artifact_keys, state_key
from orchestrator.layout import profile_id as new_id
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Artifact, ProfileStatus, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.storage import Storage, open_storage

__all__ = ["CLUSTER", "TARGET", "write_saved_profiles"]

CLUSTER = "bench"
TARGET = "stored-run"
STEPS = 5


def _rank(files: Storage, rank: int, at) -> RankResult:
    keys = rank_artifact_keys(rank, f"host{rank // 8}", 4000 + rank)
    artifacts = [
        Artifact(kind=kind, key=key, uri=files.uri(key), bytes=100_000 + rank, sha256="0" * 64)
        for kind, key in keys.items()
        if kind != "memory_timeline"
    ]
    return RankResult(
        rank=rank, local_rank=rank % 8, node_id=f"node{rank // 8:02d}" + "0" * 50, host=f"host{rank // 8}",
        pid=4000 + rank, device=f"cuda:{rank % 8}", state=RankState.DONE, first_step=100, last_step=100 + STEPS - 1,
        step_durations_ms=[31.25 + rank / 100] * STEPS, base_time_ns=1_700_000_000_000_000_000, trace_bytes=2_000_000,
        artifacts=artifacts, armed_at=at, capture_started_at=at, capture_ended_at=at, finished_at=at,
    )


def write_saved_profiles(
    home: StorageSpec, count: int, ranks: int, cluster: str = CLUSTER, newest_age: timedelta = timedelta(minutes=1)
) -> list[str]:
    """Save ``count`` finished profiles of ``ranks`` ranks each under ``home``, a minute apart, the
    newest ``newest_age`` old; returns their ids, oldest first."""
    storage = open_storage(home)
    start = utcnow() - newest_age - timedelta(minutes=count - 1)
    ids = []
    for i in range(count):
        at = start + timedelta(minutes=i)
        profile_id = new_id("prof", at, f"{i:08x}")
        files = storage.scoped(profile_prefix(TARGET, profile_id))
        status = ProfileStatus(
            id=profile_id, target=TARGET, run="raysubmit_bench", state=ProfileState.DONE,
            request=ProfileRequest(target=TARGET, steps=STEPS), start_step=100, stop_step=100 + STEPS,
            storage_uri=files.root_uri, manifest_uri=files.uri(MANIFEST_NAME),
            ranks=[_rank(files, r, at) for r in range(ranks)],
            created_at=at, scheduled_at=at, capture_started_at=at, finished_at=at,
        )
        # The controller's SavedProfile, spelled out: benchmarks must not import the actor's internals.
        saved = {"status": status.model_dump(mode="json"), "storage": home.model_dump(mode="json")}
        storage.put_state(json.dumps(saved).encode(), state_key(cluster, profile_id))
        ids.append(profile_id)
    return ids


