"""Files a controller did not write (another cluster's, another version's, a hand-edited one) never wedge it:
a lease it cannot read is replaced (the cluster name's) or skipped with a reason (a folder's owner lease)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.layout import lease_record_key, owner_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileRequest, RankState
from orchestrator.models.summaries import GcRequest
from tests.support.fake_agents import (
    FakeAgent,
    make_controller,
    run,
    start_agents,
    status_when,
    wait_terminal,
    worker_info,
)
from tests.support.inprocess_service import service_client

# What a tool that writes datetime.utcnow().isoformat() leaves: no timezone.
_NAIVE_LEASE = b'{"owner": "other-cluster", "generation": 7, "renewed_at": "2020-01-01T00:00:00"}'
_NAIVE_OWNER = (
    b'{"cluster": "other", "profile_id": "prof-20200101-000000-abcdef12", "state_uri": "file:///elsewhere", '
    b'"renewed_at": "2020-01-01T00:00:00", "expires_at": "2020-01-01T00:15:00"}'
)


def _write(home, key: str, data: bytes) -> None:
    path = Path(home.uri.removeprefix("file://")) / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_lease_with_naive_timestamps_is_replaced_and_the_controller_serves(home):
    _write(home, lease_record_key("unit", 7), _NAIVE_LEASE)

    async def scenario():
        c = make_controller(home)
        await c.ping()
        return await c.config()  # answers once saved state is restored

    assert run(scenario(), timeout_s=20).cluster_name == "unit"


def test_gc_skips_a_folder_whose_owner_lease_has_naive_timestamps_and_says_why(home):
    folder = "job/prof-20200101-000000-abcdef12"
    _write(home, owner_key("job", "prof-20200101-000000-abcdef12"), _NAIVE_OWNER)
    _write(home, f"{folder}/rank0.trace.json", b"{}")

    async def scenario():
        c = make_controller(home)
        await c.ping()
        return await c.gc(GcRequest(dry_run=True)), await c.gc(GcRequest(dry_run=False))

    dry, real = run(scenario(), timeout_s=20)
    for report in (dry, real):
        assert report.leftovers == []
        assert len(report.skipped) == 1 and "prof-20200101-000000-abcdef12" in report.skipped[0]
        assert "owner lease" in report.skipped[0]
    assert (Path(home.uri.removeprefix("file://")) / folder / "rank0.trace.json").exists()


def test_a_worker_of_another_run_with_the_same_name_cannot_end_a_rank_of_this_runs_profile(home):
    async def scenario():
        c = make_controller(home)
        job1 = await start_agents(c, 2, behaviour="hang")  # capture, then never report again
        await c.ping()
        submitted = await c.submit(ProfileRequest(target="run", run="job1", steps=3))
        capturing = await status_when(
            c, submitted.id, lambda s: all(r.state == RankState.CAPTURING for r in s.ranks), timeout_s=10
        )
        # A second job that uses the same run name: it registers normally, then reports on job 1's window.
        intruder = FakeAgent(c, worker_info(0, 2, job="job2"))
        await intruder.start()
        await intruder.report(intruder_window(capturing, job1[0]), RankState.FAILED, reason="planted")
        after = await c.get(submitted.id)
        await c.cancel(submitted.id)
        for a in (*job1, intruder):
            await a.stop()
        return after

    after = run(scenario(), timeout_s=30)
    assert [r.state for r in after.ranks] == [RankState.CAPTURING, RankState.CAPTURING], after.ranks


def intruder_window(status, armed):
    """The window job 1's rank 0 was armed with: what another process could learn from the API."""
    assert armed.windows and armed.windows[0].profile_id == status.id
    return armed.windows[0]


def test_a_profile_is_read_from_the_storage_its_record_names_after_the_storage_is_reconfigured(home, tmp_path, monkeypatch):
    async def scenario():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        await c.ping()
        done, _ = await wait_terminal(c, (await c.submit(ProfileRequest(target="run", steps=2))).id)
        for a in agents:
            await a.stop()
        key = (await c.manifest(done.id)).ranks[0].artifacts[0].key
        # `rayprof serve --storage NEW`: new profiles go elsewhere; the earlier ones' files stay where they are.
        await c.configure(StorageSpec(uri=str(tmp_path / "new-root")))
        async with service_client(monkeypatch, c) as http:
            artifact = await http.get(f"/v1/profiles/{done.id}/artifacts/{key}")
        return artifact, await c.profile_storage(done.id)

    artifact, storage = run(scenario(), timeout_s=30)
    assert artifact.status_code == 200, artifact.text
    assert storage == home
