"""A straggler whose training thread waits for a core, told from the agent's clock of the thread, not as more work.

Recorded by tests/data/record_cpu_loops.py with the agent's sampler and thread clock: two gloo ranks of an MLP under
DDP, each pinned to a core of its own, a process spinning on rank 0's core beside it (cpu_ddp_contended), and the same
without it (cpu_ddp_own_cores). Before the clock, rank 0 was "a straggler (backward)", its fix "compare its backward
spans with another rank's".
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.cpu_wait import read_thread_time, shared_cores_note, starved
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY
from tests.support.tracefiles import ANY_JSON, case, write_trace, x_event


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_a_rank_that_shares_its_core_is_told_its_thread_waits_for_a_cpu():
    found = analyze_folder(case("cpu_ddp_contended")).findings[0]
    assert found.code == "straggler" and found.ranks == [0]
    assert found.title == "Rank 0 is a straggler: its training thread waits for a CPU"
    assert "Its training thread was off a CPU" in found.evidence and "the same work as theirs" in found.evidence


def test_the_fix_gives_each_rank_cores_of_its_own_with_what_the_agent_saw():
    found = analyze_folder(case("cpu_ddp_contended")).findings[0]
    assert "beside rank 1 (1 usable core; 1 intra-op thread a rank)" in found.fix
    assert "resources_per_worker={'CPU': N}" in found.fix and "torch.set_num_threads" in found.fix
    assert "uneven input sizes" not in found.fix


def test_ranks_on_cores_of_their_own_are_told_nothing():
    assert analyze_folder(case("cpu_ddp_own_cores")).findings == []


def test_every_rank_carries_the_thread_time_the_agent_wrote():
    for r in analyze_folder(case("cpu_ddp_contended")).ranks:
        assert r.thread_time is not None and r.thread_time.usable_cores == 1
        assert 0 < r.thread_time.cpu_s <= r.thread_time.wall_s


def test_a_thread_that_gave_its_core_up_itself_waits_for_something_else():
    # A sleep, I/O, a lock or the GIL: voluntary switches, not preemptions. The same figures, but given up.
    summary = analyze_folder(case("cpu_ddp_contended"))
    (worst,) = summary.stragglers
    assert starved(worst, summary.ranks, {0}) is not None
    ranks = [
        r.model_copy(update={"thread_time": r.thread_time.model_copy(update={"voluntary_switches": 100 * len(r.steps)})})
        if r.rank == 0 else r
        for r in summary.ranks
    ]
    assert starved(worst, ranks, {0}) is None


def test_a_rank_that_lost_a_third_of_its_steps_to_waiting_for_a_core_is_noted():
    summary = analyze_folder(case("cpu_ddp_contended"))
    assert any(i.startswith("rank 0's training thread was off a CPU 33% of each step") for i in summary.issues)


def test_ranks_on_cores_of_their_own_get_no_note_of_shared_cores():
    summary = analyze_folder(case("cpu_ddp_own_cores"))
    assert not any("off a CPU" in i for i in summary.issues)


def test_threads_that_give_their_cores_up_themselves_get_no_note_of_shared_cores():
    ranks = [
        r.model_copy(update={"thread_time": r.thread_time.model_copy(update={"voluntary_switches": 100 * len(r.steps)})})
        for r in analyze_folder(case("cpu_ddp_contended")).ranks
    ]
    assert shared_cores_note(ranks) is None


def test_a_trace_without_the_agents_clock_says_nothing_of_cpus():
    summary = analyze_folder(case("cpu_ddp_varlen"))
    assert all(r.thread_time is None for r in summary.ranks) and shared_cores_note(summary.ranks) is None
    assert all(starved(s, summary.ranks, {s.rank}) is None for s in summary.stragglers)


def test_a_malformed_thread_time_is_said_and_left_unread(tmp_path: Path):
    events = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), x_event("aten::mm", 10, 900)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1, **{THREAD_TIME_METADATA_KEY: {"wall_s": -1}})
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.thread_time is None
    assert any("thread time (rayprof_thread_time): malformed" in issue for issue in rank.issues)


THREAD_FIELDS = st.fixed_dictionaries(
    {"wall_s": ANY_JSON | st.floats(), "cpu_s": ANY_JSON | st.floats(), "intra_op_threads": ANY_JSON | st.integers()},
    optional={"involuntary_switches": ANY_JSON | st.integers(), "voluntary_switches": ANY_JSON | st.integers(), "usable_cores": ANY_JSON},
)


@given(ANY_JSON.filter(lambda raw: raw is not None) | THREAD_FIELDS)
def test_any_json_under_the_thread_time_key_reads_or_is_refused_with_a_reason(raw):
    seen, why = read_thread_time({THREAD_TIME_METADATA_KEY: raw})
    assert (seen is None) != (why is None)
    if seen is not None:
        assert seen.wall_s >= 0 and seen.cpu_s >= 0 and seen.intra_op_threads >= 1
