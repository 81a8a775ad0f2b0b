"""``rayprof gc``: retention applied now, and leftover folders (no manifest, no saved state) past
a grace period deleted, on the file backend and on S3 (moto's server)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from actors.controller.clock import SYSTEM_CLOCK, Clock
from benchmarks._stored import CLUSTER, TARGET, write_saved_profiles
from orchestrator.layout import manifest_key, profile_id, state_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.summaries import GcRequest
from orchestrator.storage import open_storage
from tests.support.fake_agents import make_controller, run
from tests.support.stepped_runner import ManualClock

# The older of two stored profiles passes RETENTION (a minute and 4 s) 4 s after it is written.
RETENTION = timedelta(minutes=1, seconds=4)


@pytest.fixture(params=["file", "s3"])
def store(request, home) -> StorageSpec:
    if request.param == "file":
        return home
    s3 = request.getfixturevalue("s3_server")
    return StorageSpec(uri=f"s3://{s3.bucket}/gc-{uuid.uuid4().hex[:8]}", s3_endpoint_url=s3.endpoint_url)


def leftover(store: StorageSpec, age: timedelta, *, name: str | None = None, manifest: bool = False) -> str:
    """A profile folder with a trace in it and no saved state; returns its id."""
    folder_id = name or profile_id("prof", utcnow() - age, uuid.uuid4().hex[:8])
    storage = open_storage(store)
    storage.put_bytes(b"partial", f"{TARGET}/{folder_id}/traces/rank0.h.1.pt.trace.json.gz", "trace")
    if manifest:
        storage.put_bytes(b"{}", manifest_key(TARGET, folder_id), "manifest")
    return folder_id


def controller(store: StorageSpec, clock: Clock = SYSTEM_CLOCK):
    return make_controller(store, clock, cluster_name=CLUSTER, retention_days=RETENTION.total_seconds() / 86400)


def exists(store: StorageSpec, folder_id: str) -> bool:
    return bool(open_storage(store).list(f"{TARGET}/{folder_id}/"))


def test_gc_dry_run_lists_leftovers_past_the_grace_period_and_deletes_nothing(store):
    old = leftover(store, timedelta(days=2))
    young = leftover(store, timedelta(hours=1))

    report = run(controller(store).gc(GcRequest(dry_run=True)))

    assert report.dry_run
    assert [x.profile_id for x in report.leftovers] == [old]
    assert exists(store, old) and exists(store, young)


def test_gc_deletes_leftovers_past_the_grace_period_only(store):
    old = leftover(store, timedelta(days=2))
    young = leftover(store, timedelta(hours=1))

    report = run(controller(store).gc(GcRequest()))

    assert [x.profile_id for x in report.leftovers] == [old] and report.failed == []
    assert not exists(store, old) and exists(store, young)


def test_gc_grace_hours_of_the_request_overrides_the_setting(store):
    young = leftover(store, timedelta(hours=2))

    report = run(controller(store).gc(GcRequest(grace_hours=1)))

    assert [x.profile_id for x in report.leftovers] == [young]
    assert not exists(store, young)


def test_gc_keeps_folders_with_a_manifest_or_a_saved_state_or_a_name_rayprof_did_not_give(store):
    committed = leftover(store, timedelta(days=2), manifest=True)
    foreign = leftover(store, timedelta(days=2), name="my-notes")
    other_cluster = leftover(store, timedelta(days=2))
    open_storage(store).put_state(b"{}", state_key("another-cluster", other_cluster))

    report = run(controller(store).gc(GcRequest()))

    assert report.leftovers == []
    assert all(exists(store, f) for f in (committed, foreign, other_cluster))


def test_gc_applies_retention_now_to_profiles_that_expired_since_the_last_finish(store):
    older, newer = write_saved_profiles(store, 2, 1, newest_age=timedelta(0))
    for profile in (older, newer):
        leftover(store, timedelta(0), name=profile, manifest=True)

    async def go():
        clock = ManualClock()
        c = controller(store, clock)
        await c.ping()  # both are within retention at start
        clock.forward(5)
        dry = await c.gc(GcRequest(dry_run=True))
        return dry, await c.gc(GcRequest()), await c.list()

    dry, report, page = run(go())
    assert [p.id for p in dry.expired] == [older] and exists(store, newer)
    assert [p.id for p in report.expired] == [older]
    assert [p.id for p in page.profiles] == [newer]
    assert not exists(store, older) and not open_storage(store).exists(state_key(CLUSTER, older))


def test_a_grace_longer_than_ten_years_is_refused_before_any_date_is_computed():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="less than or equal to 87600"):
        GcRequest(grace_hours=1.3e307)
