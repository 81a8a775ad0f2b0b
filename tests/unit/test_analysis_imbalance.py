"""A different rank slowest in each step: told as an imbalance that moves, not as a straggler nor as nothing.

The recording is two gloo ranks of a DDP TransformerEncoder on batches whose sequence length each rank draws every
step (tests/data/record_cpu_loops.py, ddp_varlen); the planted sets are benchmarks/culprit.py's lockstep generator.
"""

from __future__ import annotations

import random

import pytest

from benchmarks.culprit import build_set
from orchestrator.analysis import analyze_folder
from orchestrator.analysis.imbalance import IMBALANCE_MIN_STEPS, imbalance, moving_imbalance
from orchestrator.loops import Loop
from tests.unit.test_analysis import case
from tests.unit.test_cross_culprit import DLRM


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_batches_of_uneven_length_on_two_ranks_are_told_as_a_moving_imbalance():
    summary = analyze_folder(case("cpu_ddp_varlen"))
    found = finding(summary, "imbalance")
    assert found is not None and found.severity == "warning" and found.ranks == [0, 1]
    assert "rank 0 in 4, rank 1 in 3 of the steps" in found.evidence and "mostly forward" in found.evidence
    assert "fixed number of tokens" in found.fix and "record_shapes=True" in found.fix
    # Balanced batches win the slowest rank's time over the mean: half the wait with two ranks.
    im = imbalance(summary.ranks)
    assert im is not None and found.max_saving_ms == pytest.approx(im.balanced_ms)
    assert im.balanced_ms < im.lost_ms


@pytest.mark.parametrize("n", [8, 64])
def test_a_random_rank_slowed_each_step_is_found(n):
    for seed in range(5):
        ranks, _ = build_set(DLRM, n, "moving", 0.5, random.Random(f"moving/{n}/{seed}"))
        found = moving_imbalance(ranks, [])
        assert found is not None and found.code == "imbalance", seed
        assert "mostly forward" in found.evidence


@pytest.mark.parametrize("fault", ["healthy", "slow_link", "forward", "late_start"])
@pytest.mark.parametrize("n", [8, 256])
def test_no_moving_imbalance_on_a_healthy_set_a_slow_link_or_a_lasting_straggler(fault, n):
    # A straggler slowed step after step carries its loss alone: nothing moves. Jitter of 5% per step moves little.
    for seed in range(3):
        ranks, _ = build_set(DLRM, n, fault, 0.5, random.Random(f"{fault}/{n}/{seed}"))
        assert moving_imbalance(ranks, []) is None, seed


def test_too_few_common_steps_say_nothing():
    summary = analyze_folder(case("cpu_ddp_varlen"))
    cut = [r.model_copy(update={"steps": r.steps[: IMBALANCE_MIN_STEPS - 1]}) for r in summary.ranks]
    assert imbalance(cut) is None


def test_the_fix_names_the_transformers_trainer_setting_in_its_loop():
    summary = analyze_folder(case("cpu_ddp_varlen"))
    ranks = [r.model_copy(update={"loop": Loop.TRANSFORMERS_TRAINER}) for r in summary.ranks]
    found = moving_imbalance(ranks, [])
    assert found is not None and "train_sampling_strategy='batch_rebalance'" in found.fix


def test_a_slow_load_on_a_different_rank_each_step_gets_the_loaders_fix():
    # The generator plants the moving time in forward; data runs before the all-reduce too, so moving it there
    # keeps the lockstep timing as it was.
    extra = 0.5 * DLRM.median_step_ms
    ranks, _ = build_set(DLRM, 8, "moving", 0.5, random.Random(2))

    def as_data(s):
        if s.phases.forward < extra:
            return s
        return s.model_copy(update={"phases": s.phases.model_copy(
            update={"forward": s.phases.forward - extra, "data": s.phases.data + extra})})

    ranks = [r.model_copy(update={"steps": [as_data(s) for s in r.steps]}) for r in ranks]
    found = moving_imbalance(ranks, [])
    assert found is not None and "mostly data" in found.evidence
    assert "prefetch_factor" in found.fix and "fixed number of tokens" not in found.fix
