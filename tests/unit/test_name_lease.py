"""The cluster name's lease trusts no other host's clock, and its claim is atomic: on a file system and on S3.

A controller of another Ray cluster takes the name only once it has seen the holder's renewals stand still
for a whole lease by its own clock (moved here by the test, never slept out), and two controllers that
claim at once cannot both win."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from actors.controller.saved import name_lease
from actors.controller.saved.name_lease import NameLease
from orchestrator.errors import ClusterNameInUseError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.storage.local import FileStorage
from tests.support.fake_agents import run

_LEASE_S = 60.0


class _Clock:
    """A controller's own monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _leases(home: StorageSpec) -> tuple[NameLease, NameLease, _Clock]:
    clock = _Clock()
    a = NameLease(home, "shared", "ray-a")
    b = NameLease(home, "shared", "ray-b")
    a._clock = b._clock = clock
    return a, b, clock


@pytest.fixture(params=["file", "s3"])
def store(request, home) -> StorageSpec:
    if request.param == "file":
        return home
    s3 = request.getfixturevalue("s3_server")
    return StorageSpec(uri=f"s3://{s3.bucket}/lease-{request.node.name.rsplit('[', 1)[0][-20:]}-{id(request)}", s3_endpoint_url=s3.endpoint_url)


def test_a_cluster_whose_clock_runs_ahead_does_not_take_a_live_name(store, monkeypatch):
    async def scenario():
        a, b, clock = _leases(store)
        await a.acquire(_LEASE_S)
        # b's wall clock runs two minutes ahead of a's: a's lease looks long expired to it.
        ahead = utcnow() + timedelta(seconds=120)
        monkeypatch.setattr(name_lease, "utcnow", lambda: ahead)
        refusals = 0
        for _ in range(3):
            with pytest.raises(ClusterNameInUseError):
                await b.acquire(_LEASE_S)
            refusals += 1
            clock.now += _LEASE_S / 3
            await a.acquire(_LEASE_S)  # a renews on time
        return refusals

    assert run(scenario()) == 3


def test_a_name_whose_renewals_stood_still_for_a_lease_is_taken_and_its_old_holder_learns_it(store):
    async def scenario():
        a, b, clock = _leases(store)
        await a.acquire(_LEASE_S)
        with pytest.raises(ClusterNameInUseError):
            await b.acquire(_LEASE_S)  # first seen now, by b's clock
        clock.now += _LEASE_S - 1
        with pytest.raises(ClusterNameInUseError):
            await b.acquire(_LEASE_S)
        clock.now += 2  # a whole lease without a renewal: a's cluster is gone
        await b.acquire(_LEASE_S)
        with pytest.raises(ClusterNameInUseError) as lost:
            await a.acquire(_LEASE_S)  # a's late renewal finds b holding it
        return str(lost.value)

    assert "(ray-b)" in run(scenario())


def test_two_controllers_claiming_at_once_cannot_both_win(home, monkeypatch):
    # Both read the (empty) lease before either writes: the claim itself must decide.
    barrier = threading.Barrier(2, timeout=10)
    reads = {"n": 0}
    lock = threading.Lock()
    for method in ("exists", "list"):
        original = getattr(FileStorage, method)

        def gated(self, key, _original=original):
            with lock:
                reads["n"] += 1
                first_two = reads["n"] <= 2
            found = _original(self, key)
            if first_two:
                barrier.wait()
            return found

        monkeypatch.setattr(FileStorage, method, gated)

    async def scenario():
        a, b, _ = _leases(home)
        results = await asyncio.gather(a.acquire(_LEASE_S), b.acquire(_LEASE_S), return_exceptions=True)
        return [r for r in results if r is None], [r for r in results if isinstance(r, ClusterNameInUseError)]

    won, refused = run(scenario())
    assert len(won) == 1 and len(refused) == 1, (won, refused)
