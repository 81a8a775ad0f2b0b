"""``gc`` never deletes another cluster's running profile (issue 22, item 6).

Two controllers share one profile root but keep their saved state in different
places (their homes): neither can see the other's state, so only the owner
lease in each unfinished profile's folder (``owner.json``) tells the other's
gc that the folder is in use. On the file backend and on S3 (a moto server that
is stopped and started again during the test).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta

import boto3
import pytest
from moto.server import ThreadedMotoServer

from actors.controller.saved.leases import OwnerLease
from orchestrator.errors import StorageError
from orchestrator.layout import id_created_at, owner_key, profile_id
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcRequest
from orchestrator.settings import UPLOAD_RETRIES_ENV_VAR
from orchestrator.storage import open_storage
from orchestrator.storage.local import FileStorage
from tests.support.fake_agents import make_controller, run, start_agents, status_when, until
from tests.support.stepped_runner import ManualClock

# Long enough for a profile made a second ago to count as past it.
TINY_GRACE_HOURS = 0.0001
# The owner's workers stay registered through a loaded machine's pauses (the profile must keep running).
PATIENT = {"worker_expiry_grace_s": 10.0}


class Outage:
    """moto's S3 server on a fixed port, stopped and started again by the test (its data stays:
    moto keeps buckets in the process)."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.stop()

    def start(self) -> None:
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()


@pytest.fixture
def outage(s3_server, monkeypatch):
    if not s3_server.endpoint_url.startswith("http://127.0.0.1"):
        pytest.skip("stops and starts a server of its own: moto only")
    # Few retries: calls during the outage fail in seconds instead of riding it out.
    monkeypatch.setenv(UPLOAD_RETRIES_ENV_VAR, "2")
    server = Outage()
    bucket = f"rayprof-owners-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield server, StorageSpec(uri=f"s3://{bucket}/shared", s3_endpoint_url=server.endpoint_url)
    server.stop()


def past_its_making(clock: ManualClock, folder_id: str, seconds: float) -> None:
    """Move ``clock``'s wall to ``seconds`` after ``folder_id`` was made (its id says when), as gc reads it."""
    made = id_created_at(folder_id)
    assert made is not None, folder_id
    clock.forward(max(0.0, (made + timedelta(seconds=seconds) - clock.wall()).total_seconds()))


def file_root(tmp_path, name: str) -> StorageSpec:
    return StorageSpec(uri=str(tmp_path / name))


def abandoned(root: StorageSpec, lease: str | None) -> str:
    """A folder made two days ago with a file, no manifest, no state; ``lease``: expired, unreadable or none."""
    folder_id = profile_id("prof", utcnow() - timedelta(days=2), uuid.uuid4().hex[:8])
    storage = open_storage(root)
    storage.put_bytes(b"partial", f"run/{folder_id}/traces/rank0.h.1.pt.trace.json.gz", "trace")
    if lease == "expired":
        at = utcnow() - timedelta(days=1)
        old = OwnerLease(cluster="gone", profile_id=folder_id, state_uri="s3://elsewhere", renewed_at=at, expires_at=at)
        storage.put_state(old.model_dump_json().encode(), owner_key("run", folder_id))
    elif lease == "unreadable":
        storage.put_state(b"{not json", owner_key("run", folder_id))
    return folder_id


async def running_profile(owner, root: StorageSpec):
    """A profile of ``owner`` that stays COLLECTING: rank 0 uploaded its file, rank 1 never finishes."""
    agents = await start_agents(owner, 2)
    agents[1].behaviour = "stall_upload"
    status = await owner.submit(ProfileRequest(target="run", steps=2))
    storage = open_storage(root)
    assert await until(lambda: any("/ops/" in k for k in storage.list(f"run/{status.id}/")), timeout_s=10)
    return agents, status.id


def test_gc_keeps_a_running_profile_of_a_cluster_whose_state_lives_elsewhere(tmp_path):
    root = file_root(tmp_path, "shared")

    async def go():
        a = make_controller(file_root(tmp_path, "home-a"), cluster_name="a", request_timeout_s=60, **PATIENT)
        clock = ManualClock()
        b = make_controller(file_root(tmp_path, "home-b"), clock, cluster_name="b")
        await a.configure(root)
        await b.configure(root)
        agents, running = await running_profile(a, root)
        gone = abandoned(root, lease="expired")
        past_its_making(clock, running, 1.2)  # by b's clock, the running profile is now older than the grace
        report = await b.gc(GcRequest(grace_hours=TINY_GRACE_HOURS))
        status = await a.get(running)
        for agent in agents:
            await agent.stop()
        return running, gone, report, status

    running, gone, report, status = run(go())
    assert [x.profile_id for x in report.leftovers] == [gone]
    assert status.state == ProfileState.COLLECTING
    storage = open_storage(root)
    assert storage.list(f"run/{running}/") and not storage.list(f"run/{gone}/")
    lease = OwnerLease.model_validate_json(storage.get_bytes(owner_key("run", running)))
    assert lease.cluster == "a" and lease.expires_at > utcnow()


def test_gc_deletes_an_abandoned_folder_only_once_its_lease_ran_out_and_keeps_an_unreadable_one(tmp_path):
    root = file_root(tmp_path, "shared")
    expired = abandoned(root, lease="expired")
    unreadable = abandoned(root, lease="unreadable")
    none = abandoned(root, lease=None)

    report = run(make_controller(root, cluster_name="b").gc(GcRequest()))

    assert sorted(x.profile_id for x in report.leftovers) == sorted([expired, none])
    assert open_storage(root).list(f"run/{unreadable}/")


def test_the_owner_renews_its_lease_while_running_and_removes_it_once_finished(tmp_path):
    root = file_root(tmp_path, "shared")

    async def go():
        # Rank 1 never finishes: the profile ends FAILED at its request timeout.
        a = make_controller(root, cluster_name="a", owner_lease_s=0.6, request_timeout_s=3)
        agents, running = await running_profile(a, root)
        storage = open_storage(root)
        first = OwnerLease.model_validate_json(storage.get_bytes(owner_key("run", running)))
        renewed = await until(
            lambda: OwnerLease.model_validate_json(storage.get_bytes(owner_key("run", running))).renewed_at
            > first.renewed_at,
            timeout_s=60,
        )
        # Generous bounds, left as soon as each holds: they bound a loaded machine's wall clock, not the lease.
        status = await status_when(a, running, lambda s: s.state.is_terminal, timeout_s=60)
        released = await until(lambda: not storage.exists(owner_key("run", running)), timeout_s=60)
        for agent in agents:
            await agent.stop()
        return renewed, status, released

    renewed, status, released = run(go(), timeout_s=200)
    assert renewed and status.state.is_terminal and released


def test_on_s3_through_an_outage_gc_never_deletes_the_running_profile_and_the_lease_is_renewed_after(outage):
    server, root = outage

    async def go():
        a = make_controller(StorageSpec(uri=root.uri + "-home-a", s3_endpoint_url=root.s3_endpoint_url),
                            cluster_name="a", owner_lease_s=3.0, request_timeout_s=120, **PATIENT)
        b = make_controller(root, cluster_name="b")
        await a.configure(root)
        await b.configure(root)
        agents, running = await running_profile(a, root)
        gone = abandoned(root, lease="expired")
        storage = open_storage(root)
        before = OwnerLease.model_validate_json(storage.get_bytes(owner_key("run", running)))
        server.stop()
        with pytest.raises(StorageError):
            await b.gc(GcRequest(grace_hours=TINY_GRACE_HOURS))
        await a._leases.renew()  # a renewal round in the outage: it fails (logged)
        server.start()

        def renewed() -> bool:
            lease = OwnerLease.model_validate_json(storage.get_bytes(owner_key("run", running)))
            return lease.renewed_at > before.renewed_at

        after_outage = await until(renewed, timeout_s=10, interval_s=0.2)
        report = await b.gc(GcRequest(grace_hours=TINY_GRACE_HOURS))
        status = await a.get(running)
        for agent in agents:
            await agent.stop()
        return running, gone, after_outage, report, status

    running, gone, after_outage, report, status = run(go(), timeout_s=90)
    assert after_outage
    assert [x.profile_id for x in report.leftovers] == [gone]
    assert status.state == ProfileState.COLLECTING
    assert open_storage(root).list(f"run/{running}/")


def test_gc_keeps_a_stacks_bundle_whose_ranks_are_stored_while_it_waits_for_the_last_one(tmp_path):
    root = file_root(tmp_path, "shared")

    async def go():
        a = make_controller(file_root(tmp_path, "home-a"), cluster_name="a", stacks_timeout_s=4.0, **PATIENT)
        clock = ManualClock()
        b = make_controller(file_root(tmp_path, "home-b"), clock, cluster_name="b")
        await a.configure(root)
        await b.configure(root)
        agents = await start_agents(a, 2)
        agents[1].stack = None  # never answers: the bundle waits out its timeout
        taking = asyncio.create_task(a.stacks("run"))
        storage = open_storage(root)
        assert await until(lambda: any(k.endswith("/stacks/rank0.txt") for k in storage.list("run/")), timeout_s=30)
        bundle_id = next(k for k in storage.list("run/") if k.endswith("/stacks/rank0.txt")).split("/")[1]
        past_its_making(clock, bundle_id, 1.1)  # by b's clock, the bundle is now older than the grace
        report = await b.gc(GcRequest(grace_hours=TINY_GRACE_HOURS))
        bundle = await taking
        for agent in agents:
            await agent.stop()
        return report, bundle

    report, bundle = run(go())
    assert report.leftovers == []
    assert bundle.state == ProfileState.PARTIAL
    storage = open_storage(root)
    assert f"run/{bundle.id}/stacks/rank0.txt" in storage.list(f"run/{bundle.id}/")
    assert not storage.exists(owner_key("run", bundle.id))  # removed once the bundle ended


def test_a_renewal_still_writing_when_the_profile_ends_leaves_no_lease_behind(tmp_path, monkeypatch):
    # A renewal round's write (in a worker thread) that lands after the profile ended and its lease was removed
    # wrote the lease back, and nothing removed it again: a CI run saw it (a renewal and the end, 0.2 s apart).
    root = file_root(tmp_path, "shared")
    writing, landed, removing = threading.Event(), threading.Event(), threading.Event()
    real_put, real_delete = FileStorage._put_bytes, FileStorage.delete

    def slow_lease(self, data: bytes, key: str) -> None:
        if key.endswith("owner.json") and not landed.is_set():
            writing.set()
            landed.wait(30)  # held until the profile has ended
        real_put(self, data, key)

    def delete(self, key: str) -> None:
        removing.set()
        real_delete(self, key)

    async def go():
        # Rank 1 never finishes: the profile ends at its request timeout, while the renewal's write is held.
        a = make_controller(root, cluster_name="a", owner_lease_s=3600, request_timeout_s=3)
        agents, running = await running_profile(a, root)
        monkeypatch.setattr(FileStorage, "_put_bytes", slow_lease)
        monkeypatch.setattr(FileStorage, "delete", delete)
        renewal = asyncio.create_task(a._leases.renew())
        assert await until(writing.is_set, timeout_s=30)
        status = await status_when(a, running, lambda s: s.state.is_terminal, timeout_s=60)
        # The end removes the lease; a controller that orders its lease writes waits for the held one first, and
        # the wait below runs out (5 s) with nothing removed yet.
        await until(removing.is_set, timeout_s=5)
        landed.set()
        await renewal
        gone = await until(lambda: not open_storage(root).exists(owner_key("run", running)), timeout_s=10)
        for agent in agents:
            await agent.stop()
        return status.state, gone

    state, gone = run(go(), timeout_s=120)
    assert state.is_terminal and gone
