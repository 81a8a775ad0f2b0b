"""A DataLoader whose workers start again at every epoch: told with its cost and persistent_workers=True.

Recorded by tests/data/record_cpu_loops.py: an MLP fed by DataLoader(num_workers=2) over three batches an epoch,
without (cpu_loader_restart) and with (cpu_loader_persistent) persistent_workers.
"""

from __future__ import annotations

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.between import between_note
from orchestrator.analysis.epochs import epoch_starts, loader_restart
from orchestrator.loops import Loop
from tests.unit.test_analysis import case


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_a_loader_that_starts_its_workers_every_epoch_is_told_with_the_epoch_length_and_the_fix():
    summary = analyze_folder(case("cpu_loader_restart"))
    found = finding(summary, "loader_restart")
    assert found is not None and found.severity == "warning" and summary.findings[0] is found
    assert found.evidence.startswith("Steps 3, 6 and 9 begin a new epoch of the DataLoader: a new iterator's seed draw")
    assert "An epoch here is 3 steps" in found.evidence and "persistent_workers=True" in found.fix


def test_the_restart_is_not_also_called_an_evaluation_in_the_notes():
    # Before: "step 3 ... most likely an evaluation: it reads a DataLoader 1 time before the step's own batch".
    (r,) = analyze_folder(case("cpu_loader_restart")).ranks
    assert between_note([r.model_copy(update={"steps": [s for s in r.steps if s.step <= 5]})]) is None


def test_persistent_workers_start_no_epoch_again():
    summary = analyze_folder(case("cpu_loader_persistent"))
    assert finding(summary, "loader_restart") is None
    assert all(epoch_starts(r) == [] for r in summary.ranks)


def test_one_restart_in_the_window_is_an_info_line_that_asks_for_more_steps():
    (r,) = analyze_folder(case("cpu_loader_restart")).ranks
    cut = r.model_copy(update={"steps": [s for s in r.steps if s.step <= 5]})
    found = loader_restart([cut], [])
    assert found is not None and found.severity == "info"
    assert "Step 3 begins a new epoch" in found.evidence and "Profile more steps" in found.evidence


def test_a_single_process_loader_starting_an_epoch_is_a_note_that_names_it():
    # No workers to keep: the note says what the step's head is, and no finding asks for persistent workers.
    (r,) = analyze_folder(case("cpu_loader_restart")).ranks
    single = r.model_copy(update={"data_loader": "_SingleProcessDataLoaderIter", "steps": [s for s in r.steps if s.step <= 5]})
    assert loader_restart([single], []) is None
    note = between_note([single])
    assert note is not None and "most likely the DataLoader starting a new epoch: a new iterator's seed draw and only" in note


def test_the_fix_names_the_trainers_setting_in_its_loop():
    (r,) = analyze_folder(case("cpu_loader_restart")).ranks
    found = loader_restart([r.model_copy(update={"loop": Loop.TRANSFORMERS_TRAINER})], [])
    assert found is not None and "TrainingArguments(dataloader_persistent_workers=True)" in found.fix


def test_lightning_reading_a_batch_ahead_restarts_are_found_without_the_read_that_ends_the_epoch():
    # Lightning's fetcher reads the batch after the one it returns: the read that ends an epoch falls in the step
    # before, so the new epoch's first step reads nothing before its own batch; before, the note called these
    # steps "most likely a checkpoint save writing its files, or a logger's network calls".
    summary = analyze_folder(case("cpu_lightning_loader_restart"))
    (r,) = summary.ranks
    assert [s.between_fetches for s in epoch_starts(r)] == [0, 0, 0]
    found = finding(summary, "loader_restart")
    assert found is not None and found.evidence.startswith("Steps 3, 6 and 9 begin a new epoch")
    assert between_note(summary.ranks) is None


def test_a_checkpoint_save_in_a_job_whose_loader_has_workers_is_no_restart():
    # A save reads no batch and runs almost no torch op, as a restart does; it draws no seed.
    (r,) = analyze_folder(case("cpu_hf_trainer_save")).ranks
    workers = r.model_copy(update={"data_loader": "_MultiProcessingDataLoaderIter"})
    assert epoch_starts(workers) == [] and loader_restart([workers], []) is None
    note = between_note([workers])
    assert note is not None and "most likely a checkpoint save" in note


def test_a_summary_from_before_seed_draws_were_counted_goes_by_the_one_read():
    (r,) = analyze_folder(case("cpu_loader_restart")).ranks
    old = r.model_copy(update={"steps": [s.model_copy(update={"between_seeds": None}) for s in r.steps]})
    assert [s.step for s in epoch_starts(old)] == [3, 6, 9]
    found = loader_restart([old], [])
    assert found is not None and "begin a new epoch of the DataLoader: one more read, the one that ends an epoch" in found.evidence
