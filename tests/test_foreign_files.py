"""Files a controller did not write (another cluster's, another version's, a hand-edited one) never wedge it:
a lease it cannot read is replaced (the cluster name's) or skipped with a reason (a folder's owner lease)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.layout import lease_key, owner_key
from orchestrator.models.summaries import GcRequest
from tests.fake_agents import make_controller, run

# What a tool that writes datetime.utcnow().isoformat() leaves: no timezone.
_NAIVE_LEASE = b'{"owner": "other-cluster", "renewed_at": "2020-01-01T00:00:00", "expires_at": "2020-01-01T00:01:00"}'
_NAIVE_OWNER = (
    b'{"cluster": "other", "profile_id": "prof-20200101-000000-abcdef12", "state_uri": "file:///elsewhere", '
    b'"renewed_at": "2020-01-01T00:00:00", "expires_at": "2020-01-01T00:15:00"}'
)


def _write(home, key: str, data: bytes) -> None:
    path = Path(home.uri.removeprefix("file://")) / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_lease_with_naive_timestamps_is_replaced_and_the_controller_serves(home):
    _write(home, lease_key("unit"), _NAIVE_LEASE)

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
