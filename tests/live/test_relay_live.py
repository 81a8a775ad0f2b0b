"""The live job's agents reach the controller through the relay on their node."""

from __future__ import annotations

import pytest
import ray

from orchestrator.models.requests import ProfileState, RankState
from orchestrator.settings import CONTROLLER_NAMESPACE
from tests.support.common import LIVE_TARGET

pytestmark = pytest.mark.integration


def relays() -> list[str]:
    return sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rayprof-relay-")
    )


def test_the_live_job_runs_one_relay_on_its_one_node(live_job, client):
    assert len(relays()) == 1


def test_a_window_through_the_relay_is_done_on_every_rank_and_its_calls_went_through_the_relay(live_job, client):
    (name,) = relays()
    relay = ray.get_actor(name, namespace=CONTROLLER_NAMESPACE)
    before = ray.get(relay.counters.remote(), timeout=30)
    manifest = client.profile(LIVE_TARGET, steps=2).wait(timeout=120)
    after = ray.get(relay.counters.remote(), timeout=30)
    assert manifest.status == ProfileState.DONE
    assert [r.state for r in manifest.ranks] == [RankState.DONE, RankState.DONE]
    assert after["report_many"] > before["report_many"]
    assert after["poll_node"] > before["poll_node"]
