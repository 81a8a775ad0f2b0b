"""Ranks whose training threads wait for a core most of each step are told so, with the fix: cores of their own.

Recorded through the live service (tests/unit/test_analysis_scheduler_noise.py's job: rayprof's example job, two
gloo ranks on the two-core machine beside Ray's processes), a window of 20 steps while two other processes spun on
both cores (cpu_ddp_oversubscribed): ~25 ms steps took ~800 ms, each rank's thread off a CPU ~88% of the step, and
the report said "No findings" (no rank stood out, and the wait was a note).
"""

from __future__ import annotations

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.cores_finding import cores_shared
from orchestrator.analysis.cpu_wait import CORES_SHARED_WARNING, shared_cores_note, waiting
from orchestrator.models.analysis import RankSummary, Straggler
from tests.support.tracefiles import case


def _finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_ranks_that_wait_for_a_cpu_most_of_each_step_are_told_so_first():
    summary = analyze_folder(case("cpu_ddp_oversubscribed"))
    found = summary.findings[0]
    assert found.code == "cores_shared" and found.severity == "warning" and found.ranks == [0, 1]
    assert found.title.startswith("The training threads of ranks 0, 1 wait for a CPU")
    assert "other threads or processes ran on their cores" in found.evidence


def test_the_fix_gives_every_rank_cores_of_its_own_with_what_the_agents_saw():
    found = _finding(analyze_folder(case("cpu_ddp_oversubscribed")), "cores_shared")
    assert found is not None
    assert "The hosts of ranks 0, 1" in found.fix and "2 usable cores; 1 intra-op thread a rank" in found.fix
    assert "resources_per_worker={'CPU': N}" in found.fix and "torch.set_num_threads" in found.fix


def test_its_bound_is_the_median_ranks_wait_a_step():
    ranks = analyze_folder(case("cpu_ddp_oversubscribed")).ranks
    found = cores_shared(ranks, [])
    waits = sorted(w.off_cpu_ms for r in ranks if (w := waiting(r)) is not None)
    assert found is not None and found.max_saving_ms == waits[(len(waits) - 1) // 2]
    assert all(w >= CORES_SHARED_WARNING * r.mean_step_ms for r in ranks if (w := waiting(r).off_cpu_ms))


def test_the_note_leaves_out_the_ranks_the_finding_names():
    summary = analyze_folder(case("cpu_ddp_oversubscribed"))
    assert shared_cores_note(summary.ranks) is None
    assert not any("off a CPU" in i for i in summary.issues)


def test_a_healthy_job_waiting_under_half_its_step_gets_the_note_and_no_finding():
    summary = analyze_folder(case("cpu_ddp_scheduler_jitter"))
    assert _finding(summary, "cores_shared") is None
    assert shared_cores_note(summary.ranks) is not None


def test_threads_that_give_their_cores_up_themselves_are_not_told():
    ranks = [_yielding(r) for r in analyze_folder(case("cpu_ddp_oversubscribed")).ranks]
    assert cores_shared(ranks, []) is None


def test_a_straggler_is_left_to_its_own_finding():
    ranks = analyze_folder(case("cpu_ddp_oversubscribed")).ranks
    rank0 = Straggler(rank=0, phase="forward", excess_ms=10.0, excess_fraction=0.1, phase_excess_ms=10.0,
                      comm_wait_ms=0.0, reference_comm_wait_ms=10.0)
    found = cores_shared(ranks, [rank0])
    assert found is not None and found.ranks == [1] and "The training thread of rank 1" in found.title


def test_ranks_without_the_agents_clock_are_not_told():
    assert cores_shared(analyze_folder(case("cpu_ddp_varlen")).ranks, []) is None


def _yielding(r: RankSummary) -> RankSummary:
    t = r.thread_time
    assert t is not None
    return r.model_copy(update={"thread_time": t.model_copy(update={"voluntary_switches": 100 * len(r.steps)})})


def _steps_with(r: RankSummary, **fields: float) -> RankSummary:
    return r.model_copy(update={"steps": [s.model_copy(update=fields) for s in r.steps]})


def test_a_loop_whose_own_python_holds_the_wait_is_not_told():
    # A loop that sleeps or reads files of its own is off a CPU there without waiting for a core; one long sleep is
    # one switch among the preemptions, so the counts cannot tell.
    ranks = [_steps_with(r, python_ms=0.6 * (r.mean_step_ms or 0)) for r in analyze_folder(case("cpu_ddp_oversubscribed")).ranks]
    assert cores_shared(ranks, []) is None
    assert shared_cores_note(ranks) is not None  # what the thread clock saw is still said


def test_ray_trains_report_is_a_wait_the_thread_clock_leaves_out():
    ranks = analyze_folder(case("cpu_ddp_oversubscribed")).ranks
    before = [waiting(r).off_cpu_ms for r in ranks]
    reporting = [_steps_with(r, report_ms=500.0) for r in ranks]
    after = [waiting(r).off_cpu_ms for r in reporting]
    assert after == pytest.approx([max(0.0, b - 500.0) for b in before])
    assert cores_shared(reporting, []) is None
