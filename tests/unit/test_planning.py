"""The controller's decisions as pure functions: start step, window length, outcome."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from actors.controller.profiles.planning import arm_round_s, outcome, plan_window, start_step, validate
from actors.controller.profiles.state import Window
from orchestrator.errors import TargetNotFoundError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import HOW_A_RUN_APPEARS
from orchestrator.models.profile import RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.fake_agents import fast_config


def rank(r: int, state: RankState, last_step: int | None = None, reason: str | None = None) -> RankResult:
    return RankResult(rank=r, state=state, first_step=None if last_step is None else 0, last_step=last_step, reason=reason)


def test_the_start_step_leads_the_fastest_rank_by_at_least_three_steps():
    assert start_step(100.4, [1.0], sync_round_s=0.0, arm_lead_s=0.0, warmup=0) == 103


def test_the_lead_covers_the_arm_time_at_the_fastest_step_time():
    # 4 x 0.25 s = 1 s of training at 0.01 s a step: 100 steps ahead.
    assert start_step(10.0, [0.02, 0.01], sync_round_s=0.25, arm_lead_s=0.3, warmup=0) == 110


def test_the_configured_lead_is_a_floor_not_added_to_the_arm_time():
    # A fast sync round (4 x 0.05 s = 0.2 s) does not cut the lead below 0.3 s: 30 steps.
    assert start_step(10.0, [0.01], sync_round_s=0.05, arm_lead_s=0.3, warmup=0) == 40
    # A slow one is not padded by it either: 2 x 0.45 s through relays, 90 steps, not 120.
    assert start_step(10.0, [0.01], sync_round_s=0.45, arm_lead_s=0.3, warmup=0, relayed=True) == 100


def test_warmup_steps_come_before_the_window():
    assert start_step(10.0, [], sync_round_s=0.0, arm_lead_s=0.0, warmup=2) == 15


def test_a_window_that_fits_the_cap_keeps_every_step():
    window = plan_window(ProfileRequest(target="t", steps=10), 50, per_step_bytes=100.0, cap=1000)
    assert window == Window(50, 10, None)


def test_a_window_that_would_pass_the_cap_is_shortened_and_says_why():
    window = plan_window(ProfileRequest(target="t", steps=10), 50, per_step_bytes=300.0, cap=1000)
    assert (window.steps, window.stop_step) == (3, 53)
    assert window.note.startswith("window shortened from 10 to 3 steps")


def test_every_rank_done_on_every_step_is_done():
    assert outcome([rank(0, RankState.DONE, 9), rank(1, RankState.DONE, 9)], Window(0, 10), False) == (
        ProfileState.DONE,
        None,
    )


def test_a_rank_cut_at_the_byte_cap_makes_the_profile_partial():
    state, reason = outcome([rank(0, RankState.DONE, 9), rank(1, RankState.DONE, 4)], Window(0, 10), False)
    assert state == ProfileState.PARTIAL
    assert "ranks [1] cut their trace" in reason


@pytest.mark.parametrize("ranks", [[], [rank(0, RankState.FAILED, reason="boom")]])
def test_no_rank_done_is_failed_never_done(ranks):
    assert outcome(ranks, Window(0, 10), False)[0] == ProfileState.FAILED


def test_a_cancelled_profile_is_cancelled_whatever_its_ranks_did():
    assert outcome([rank(0, RankState.DONE, 9)], Window(0, 10), True)[0] == ProfileState.CANCELLED


def test_through_relays_the_lead_is_shorter_because_arming_costs_one_node_round_trip():
    direct = start_step(10.0, [0.1], sync_round_s=0.5, arm_lead_s=0.3, warmup=0)
    relayed = start_step(10.0, [0.1], sync_round_s=0.5, arm_lead_s=0.3, warmup=0, relayed=True)
    assert (direct, relayed) == (10 + 20, 10 + 10)


def test_a_target_whose_last_window_was_slow_to_arm_gets_a_longer_lead():
    quick = start_step(10.0, [0.1], sync_round_s=0.2, arm_lead_s=0.3, warmup=0, relayed=True)
    remembered = start_step(10.0, [0.1], sync_round_s=0.2, arm_lead_s=0.3, warmup=0, relayed=True, last_arm_round_s=2.0)
    assert (quick, remembered) == (10 + 4, 10 + 30)


def test_the_arm_round_is_schedule_to_the_last_armed_rank():
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ranks = [
        RankResult(rank=0, state=RankState.DONE, armed_at=at + timedelta(seconds=0.2)),
        RankResult(rank=1, state=RankState.FAILED, armed_at=at + timedelta(seconds=0.9)),
        RankResult(rank=2, state=RankState.FAILED),
    ]
    assert arm_round_s(ranks, at) == 0.9
    assert arm_round_s(ranks[2:], at) is None


def test_an_unknown_target_is_told_the_live_ones_by_name():
    with pytest.raises(TargetNotFoundError) as missing:
        validate(ProfileRequest(target="nope", steps=2), fast_config(StorageSpec(uri="file:///tmp/unused")), None, ["b-run", "a-run"])
    assert missing.value.message == "no live training run named 'nope'; known targets: 'a-run', 'b-run'"


def test_an_unknown_target_with_no_live_run_is_told_how_a_run_becomes_one():
    with pytest.raises(TargetNotFoundError) as missing:
        validate(ProfileRequest(target="nope", steps=2), fast_config(StorageSpec(uri="file:///tmp/unused")), None, [])
    assert missing.value.message.endswith(f"known targets: none ({HOW_A_RUN_APPEARS})")
    assert "worker_process_setup_hook 'actors.agent.install'" in missing.value.message
