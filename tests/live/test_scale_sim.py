"""Hundreds of simulated ranks behind relays, against the session's real controller actor.

The simulated ranks (``benchmarks.sim_host.SimHost``: the real protocol, the
real ``RelayCore`` per 8-rank node, steps on a 100 ms clock) stand in for a job
too large for this machine; ``make bench`` runs the same at 1,024 and 4,096.
"""

from __future__ import annotations

import time

import pytest
import ray

from benchmarks.sim_host import SimHost
from orchestrator.models.requests import ProfileState, RankState
from orchestrator.settings import DEFAULT_POLL_TIMEOUT_S, POLL_TIMEOUT_S_ENV_VAR, env_float
from tests.support.common import wait_for

pytestmark = pytest.mark.integration

RANKS = 256
PER_NODE = 8
HOSTS = 2
TARGET = "sim-relayed"


@pytest.fixture(scope="module")
def sim_ranks(client):
    poll_timeout_s = env_float(POLL_TIMEOUT_S_ENV_VAR, DEFAULT_POLL_TIMEOUT_S)
    block = RANKS // HOSTS
    job_started = time.monotonic() - 5.0
    hosts = [
        SimHost.remote(
            TARGET, list(range(h * block, (h + 1) * block)), RANKS, h, 0.1, PER_NODE, poll_timeout_s, job_started
        )
        for h in range(HOSTS)
    ]
    try:
        ray.get([h.start.remote(2.0) for h in hosts], timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(c["outstanding_polls"] for c in ray.get([h.counters.remote() for h in hosts])) >= RANKS:
                break
            time.sleep(0.5)
        yield hosts
    finally:
        ray.get([h.stop.remote() for h in hosts], timeout=30)
        for h in hosts:
            ray.kill(h)


def test_every_simulated_rank_behind_relays_is_listed_with_its_step(client, sim_ranks):
    def listed():
        found = [t for t in client.targets() if t.name == TARGET]
        # A rank's first heartbeat reaches the controller with its relay's next node poll.
        return found if found and min(r.step for r in found[0].ranks) >= 50 else None

    (target,) = wait_for(listed, timeout=30, what="every simulated rank's heartbeat")
    assert target.world_size == RANKS
    assert sorted(r.info.world_rank for r in target.ranks) == list(range(RANKS))


def test_a_window_on_256_ranks_behind_relays_misses_no_rank(client, sim_ranks):
    manifest = client.profile(TARGET, steps=2, timeout_s=120).wait(timeout=180)
    missed = [(r.rank, r.state.value, r.reason) for r in manifest.ranks if r.state != RankState.DONE]
    if missed and all("start boundary" in reason for _, _, reason in missed):
        # The first window's lead comes from the sync round; on a loaded machine the arm can take longer
        # to reach the last nodes (CI saw 24 of 256 miss). The planner remembers the arm round it saw:
        # the next window's lead covers it, and that one must miss no rank.
        print(f"first window: {len(missed)} ranks missed its start; the next is planned with the arm round seen")
        manifest = client.profile(TARGET, steps=2, timeout_s=120).wait(timeout=180)
        missed = [(r.rank, r.state.value, r.reason) for r in manifest.ranks if r.state != RankState.DONE]
        arms = 2 * RANKS
    else:
        arms = RANKS
    assert manifest.status == ProfileState.DONE, f"{len(missed)} ranks not DONE, first: {missed[:3]}"
    assert [r.state for r in manifest.ranks] == [RankState.DONE] * RANKS
    # Every rank was armed once per window, the last with the window the manifest names.
    assert sum(c["arms"] for c in ray.get([h.counters.remote() for h in sim_ranks])) == arms
    assert {(r.first_step, r.last_step) for r in manifest.ranks} == {(manifest.start_step, manifest.stop_step - 1)}
