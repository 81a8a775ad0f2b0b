"""Who holds a lockstep job back: cross-rank verdicts on planted sets (benchmarks/culprit.py's generator)."""

from __future__ import annotations

import random

import pytest

from benchmarks.culprit import RealStep, Template, build_set, named_culprits

# One real step of PARAM's DLRM on V100 (rank 2 of 8, as rayprof breaks it down), and its all-reduce's transfer.
DLRM = Template(
    "dlrm",
    [RealStep(busy={"data": 1.3, "forward": 4.8, "backward": 4.4, "optimizer": 1.4, "memcpy": 0.2, "sync": 0.4,
                    "other": 0.1}, transfer_ms=1.9)],
    median_step_ms=14.5,
)


@pytest.mark.parametrize("fault", ["forward", "data", "backward"])
@pytest.mark.parametrize("n", [8, 64])
def test_a_rank_a_fifth_slower_is_named_though_everyone_waits_for_it(fault, n):
    # Lockstep: every rank's step grows by the straggler's 20%, so a threshold taken as a share of
    # that grown step (15% of 1.2x = 18%) rose with the fault itself and missed it.
    for seed in range(5):
        ranks, planted = build_set(DLRM, n, fault, 0.2, random.Random(f"{fault}/{n}/{seed}"))
        assert named_culprits(ranks) == {next(iter(planted)): fault}


def test_a_rank_slow_after_the_all_reduce_is_named_for_its_optimizer_not_only_as_late():
    # Its optimizer delays its next step's start: late, and busy for the same time.
    for seed in range(5):
        ranks, planted = build_set(DLRM, 32, "optimizer", 0.5, random.Random(seed))
        assert named_culprits(ranks) == dict.fromkeys(planted, "optimizer"), seed


def test_a_slow_node_names_its_eight_ranks():
    ranks, planted = build_set(DLRM, 32, "slow_node", 0.2, random.Random(1))
    assert named_culprits(ranks) == dict.fromkeys(planted, "forward")


@pytest.mark.parametrize("late", [0.16, 0.2])
def test_a_rank_that_starts_late_by_more_than_the_bar_is_named_as_a_late_arrival(late):
    # The others' steps grow by the late start too: 16% late made the old bar 15% of 1.16x and more.
    ranks, planted = build_set(DLRM, 32, "late_start", late, random.Random(2))
    assert named_culprits(ranks) == dict.fromkeys(planted, "late_arrival")


@pytest.mark.parametrize("fault", ["healthy", "slow_link"])
def test_no_rank_is_named_when_none_is_to_blame(fault):
    for n in (8, 256):
        ranks, _ = build_set(DLRM, n, fault, 1.0, random.Random(f"{fault}/{n}"))
        assert named_culprits(ranks) == {}
