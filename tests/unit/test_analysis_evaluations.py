"""An evaluation before most steps' batches, told as the loop's setting (orchestrator.analysis.evaluations).

Recorded by tests/data/record_cpu_sentence_transformers.py: sentence-transformers 6.2's trainer, unmodified, with an
evaluator run every step (and every other step). Before: "No warning" and one info line, while the evaluation held
80% of the time (measured unprofiled): a note needs at most half the steps, and no finding named it.
"""

from __future__ import annotations

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.evaluations import evaluating_steps
from orchestrator.models.analysis import OpStat, RankSummary
from tests.support.tracefiles import case


def _rank(name: str) -> RankSummary:
    (rank,) = analyze_folder(case(name)).ranks
    return rank


def test_an_evaluation_before_every_step_is_the_first_finding_with_the_trainers_eval_steps():
    summary = analyze_folder(case("cpu_st_evaluator"))
    found = summary.findings[0]
    assert found.code == "evaluation" and found.severity == "warning" and found.ranks == [0]
    assert found.title.startswith("An evaluation runs before every step's batch: ")
    assert "3 of the 3 steps on rank 0 run BaseTrainer.evaluate (sentence_transformers/base/trainer.py:" in found.evidence
    assert "In transformers' Trainer: TrainingArguments(eval_strategy='steps', eval_steps=N)" in found.fix
    assert 0.5 < found.max_saving_fraction < 1.0
    assert not any("before it fetches its batch" in i or "before they fetch" in i for i in summary.issues)


def test_an_evaluation_in_two_of_three_steps_says_which_share_of_the_window():
    found = analyze_folder(case("cpu_st_eval_every2")).findings[0]
    assert found.code == "evaluation" and found.title.startswith("An evaluation runs before 2 of the 3 steps' batches")
    assert "in most steps of the window" in found.evidence


def test_the_same_fine_tune_without_an_evaluator_warns_nothing():
    summary = analyze_folder(case("cpu_st_mnrl"))
    assert [f.severity for f in summary.findings] == ["info"]
    assert evaluating_steps(summary.ranks[0]) == []


@pytest.mark.parametrize("name", ["cpu_lightning_validate", "cpu_evaluate_often", "cpu_hf_trainer_save"])
def test_an_evaluation_or_save_in_a_few_steps_stays_the_notes(name):
    summary = analyze_folder(case(name))
    assert not any(f.code == "evaluation" for f in summary.findings)


def test_work_before_the_batch_that_is_no_evaluation_is_not_told():
    rank = _rank("cpu_st_evaluator")
    saving = [OpStat(name="my_job/ckpt.py(12): save_every_step", calls=20, total_ms=100.0)]
    steps = [s.model_copy(update={"between_frames": saving}) for s in rank.steps]
    assert evaluating_steps(rank.model_copy(update={"steps": steps})) == []


def test_half_the_steps_evaluating_is_no_finding():
    rank = _rank("cpu_st_evaluator")
    quiet = [s.model_copy(update={"between_ms": 0.0}) if i % 2 else s for i, s in enumerate([*rank.steps, rank.steps[0]])]
    assert len(quiet) == 4 and evaluating_steps(rank.model_copy(update={"steps": quiet})) == []
