"""A DataLoader whose worker processes compete with the step for the rank's cores (tests/data/record_cpu_pyg.py: a
PyTorch Geometric GCN, torch_geometric 2.8.1, num_workers=2 beside one training thread on the 2-core box). The agent's
thread clock says the training thread was preempted again and again; more workers would take more of its cores."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.data_fix import PREEMPTED_PER_S, data_fix
from tests.support.realtraces import finding, only_rank
from tests.support.tracefiles import case

_SUMMARY = analyze_folder(case("cpu_pyg_gcn_workers"))


def test_workers_that_take_the_steps_cores_are_not_told_to_be_more() -> None:
    # Before: "Load batches in parallel with the step: raise DataLoader num_workers (e.g. to the CPU cores per GPU)",
    # while one worker or two made this loop's step 1.5-1.9x as long as loading in the step's process.
    fix = finding(_SUMMARY, "dataloader_bound").fix
    assert fix.startswith("The loader already runs in worker processes, and the training thread was preempted ")
    assert "on a host where it has 2 usable cores" in fix and "num_workers=0 spares the transfer" in fix
    assert "raise DataLoader num_workers" not in fix


@given(st.floats(min_value=0.0, max_value=PREEMPTED_PER_S * 0.99))
def test_a_thread_that_keeps_its_core_gets_the_workers_advice(per_s: float) -> None:
    # The same loader on a host with cores to spare: the thread is preempted less often than once a scheduler slice.
    rank = only_rank(_SUMMARY)
    assert rank.thread_time is not None
    quiet = rank.thread_time.model_copy(update={"involuntary_switches": int(per_s * rank.thread_time.wall_s)})
    fix = data_fix(rank.model_copy(update={"thread_time": quiet}))
    assert fix.startswith("Load batches in parallel with the step: raise DataLoader num_workers")


def test_a_loader_in_the_steps_own_process_is_not_told_about_its_workers() -> None:
    rank = only_rank(_SUMMARY)
    fix = data_fix(rank.model_copy(update={"data_loader": "_SingleProcessDataLoaderIter"}))
    assert "already runs in worker processes" not in fix
