"""Finished profiles are kept as summaries and read in full only when one is asked for;
a restart reads the index of finished profiles, not every saved state."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._stored import CLUSTER, write_saved_profiles
from orchestrator.errors import StorageError
from orchestrator.layout import index_key, state_key
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileState, RankState
from tests.support.fake_agents import make_controller, run

RANKS = 4


def controller(home: StorageSpec):
    return make_controller(home, cluster_name=CLUSTER)


def root(home: StorageSpec) -> Path:
    return Path(home.uri.removeprefix("file://"))


def test_list_items_are_summaries_with_rank_counts_per_state(home):
    write_saved_profiles(home, 3, RANKS)

    page = run(controller(home).list())

    assert page.total == 3
    assert all(p.rank_states == {RankState.DONE: RANKS} and p.steps == 5 for p in page.profiles)
    assert "ranks" not in page.profiles[0].model_dump()


def test_a_finished_profile_is_read_in_full_when_asked_for(home):
    oldest = write_saved_profiles(home, 3, RANKS)[0]

    status = run(controller(home).get(oldest))

    assert status.state == ProfileState.DONE
    assert [r.rank for r in status.ranks] == list(range(RANKS))


def test_a_restart_lists_finished_profiles_from_the_index_without_reading_their_state(home):
    ids = write_saved_profiles(home, 3, RANKS)
    run(controller(home).ping())  # writes the index
    (root(home) / state_key(CLUSTER, ids[0])).write_text("not json")

    async def go():
        c = controller(home)
        page = await c.list()
        with pytest.raises(StorageError, match="unreadable"):
            await c.get(ids[0])
        return page

    assert {p.id for p in run(go()).profiles} == set(ids)


def test_a_missing_index_is_rebuilt_from_the_saved_state(home):
    ids = write_saved_profiles(home, 3, RANKS)

    page = run(controller(home).list())

    assert {p.id for p in page.profiles} == set(ids)
    assert (root(home) / index_key(CLUSTER)).is_file()


def test_an_unreadable_index_is_rebuilt_from_the_saved_state(home):
    ids = write_saved_profiles(home, 3, RANKS)
    run(controller(home).ping())
    (root(home) / index_key(CLUSTER)).write_text("{broken")

    page = run(controller(home).list())

    assert {p.id for p in page.profiles} == set(ids)
    assert '"profiles"' in (root(home) / index_key(CLUSTER)).read_text()


def test_a_profile_saved_after_the_index_was_written_is_found_on_restart(home):
    indexed = write_saved_profiles(home, 2, RANKS)
    run(controller(home).ping())
    later = write_saved_profiles(home, 1, RANKS)

    page = run(controller(home).list())

    assert {p.id for p in page.profiles} == {*indexed, *later}


def test_a_profile_whose_state_was_deleted_is_dropped_from_the_index_on_restart(home):
    ids = write_saved_profiles(home, 3, RANKS)
    run(controller(home).ping())
    (root(home) / state_key(CLUSTER, ids[1])).unlink()

    page = run(controller(home).list())

    assert {p.id for p in page.profiles} == {ids[0], ids[2]}
