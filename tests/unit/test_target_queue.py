"""The line in front of a target: a profile that has ended, or was deleted, before its window task
released the slot is not in the way of the next submit."""

from __future__ import annotations

from actors.controller.profiles.target_queue import TargetQueue
from orchestrator.models.control import ControllerConfig
from orchestrator.models.requests import ProfileRequest


def test_a_deleted_profile_still_holding_its_slot_does_not_block_the_next_submit():
    # A delete drops the profile from the catalog at once; its window task leaves the slot a moment later.
    queue = TargetQueue({}, ControllerConfig)
    queue.active["run"] = "prof-deleted"
    queue.admit(ProfileRequest(target="run", steps=3))


def test_a_deleted_profile_still_in_the_waiting_line_does_not_count_against_the_queue_limit():
    queue = TargetQueue({}, lambda: ControllerConfig(max_queued_per_target=1))
    queue.waiting["run"] = ["prof-deleted"]
    queue.admit(ProfileRequest(target="run", steps=3))
