"""Python's garbage collector pausing the training thread, told from the collections the agent timed.

Recorded by tests/data/record_cpu_gc.py: two gloo ranks of an MLP under DDP, each holding its shard of a corpus as
Python dicts. cpu_gc_collect_every_step calls gc.collect() after every step (before the watch: "No findings", 207 ms
of a 235 ms step in "other"); cpu_gc_automatic keeps 15,000 records a step, and the collector's own full collections
fall in different steps on the two ranks (before: "Communication does not overlap computation", bucket advice);
cpu_gc_frozen is the same after gc.freeze() (before: "Rank 1 is a straggler (other)").
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.culprit import build_set
from orchestrator.analysis import analyze_folder
from orchestrator.analysis.cross import stragglers as cross_stragglers
from orchestrator.analysis.gc_finding import SUMMARY_COLLECTIONS, gc_pause, read_gc
from orchestrator.analysis.host_python import host_python
from orchestrator.analysis.imbalance import moving_imbalance
from orchestrator.analysis.straggler_finding import straggler
from orchestrator.models.gc_pauses import GC_METADATA_KEY, GcCollection, GcPauses
from tests.support.tracefiles import ANY_JSON, case, write_trace, x_event
from tests.unit.test_cross_culprit import DLRM


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_a_gc_collect_in_every_step_is_the_first_finding_with_its_calling_line():
    found = analyze_folder(case("cpu_gc_collect_every_step")).findings[0]
    assert found.code == "gc_pause" and found.severity == "warning" and found.ranks == [0, 1]
    assert found.title.startswith("The loop calls gc.collect() every step, up to ")
    # Named as every finding names a line (before: "record_cpu_gc.py(62): _gc_rank", as the trace writes it).
    assert found.evidence.startswith("_gc_rank (record_cpu_gc.py:62) calls gc.collect() every step")
    assert found.fix.startswith("Take gc.collect() out of the step") and "gc.freeze()" in found.fix
    assert found.max_saving_fraction > 0.5


def test_the_collectors_own_full_collections_name_where_each_rank_paused():
    found = analyze_folder(case("cpu_gc_automatic")).findings[0]
    assert found.code == "gc_pause" and found.severity == "warning"
    assert "full collections in 3 of 8 steps" in found.title
    assert "rank 0 in steps 2, 6" in found.evidence and "rank 1 in step 4" in found.evidence


def test_ranks_that_collect_in_different_steps_are_told_to_collect_together():
    found = analyze_folder(case("cpu_gc_automatic")).findings[0]
    assert "Call gc.freeze() once the model, optimizer and data are built" in found.fix
    assert "gc.disable() after set-up and gc.collect(1) every N steps" in found.fix
    assert "--manual-gc" in found.fix and "training.gc_freq" in found.fix


def test_the_wait_for_another_ranks_pauses_is_not_told_as_exposed_communication():
    summary = analyze_folder(case("cpu_gc_automatic"))
    assert finding(summary, "comm_exposed") is None


def test_after_gc_freeze_the_fix_says_what_the_walk_still_holds():
    found = analyze_folder(case("cpu_gc_frozen")).findings[0]
    assert found.code == "gc_pause"
    assert "gc.freeze() already keeps" in found.fix and "keep less" in found.fix
    assert "Call gc.freeze()" not in found.fix


def test_a_rank_slower_for_its_collections_is_not_told_as_a_straggler_of_its_own():
    summary = analyze_folder(case("cpu_gc_frozen"))
    assert summary.stragglers and finding(summary, "straggler") is None


def test_gc_freeze_shortens_the_pauses_the_finding_bounds():
    before = finding(analyze_folder(case("cpu_gc_automatic")), "gc_pause")
    after = finding(analyze_folder(case("cpu_gc_frozen")), "gc_pause")
    assert before is not None and after is not None
    assert after.max_saving_ms < before.max_saving_ms / 4


def test_a_trace_without_the_agents_watch_says_nothing_of_collections():
    summary = analyze_folder(case("cpu_ddp_varlen"))
    assert all(r.gc is None for r in summary.ranks) and finding(summary, "gc_pause") is None


def _one_rank(
    tmp_path: Path, pause_ms: float, *, explicit: bool = False, generation: int = 2, training_thread: bool = True,
    cpu_ms: float | None = None,
) -> Path:
    """One rank of four 100 ms steps from unix time 1,000 s on, a collection of ``pause_ms`` by the clock in its second
    step (``cpu_ms`` of work; None: an agent before it timed that)."""
    base_ns = 1_000_000_000_000
    events = [x_event(f"ProfilerStep#{i}", i * 100_000, 100_000, cat="user_annotation") for i in range(4)]
    events += [x_event("aten::mm", i * 100_000 + 10, 90_000) for i in range(4)]
    collection = {
        "start_us": base_ns // 1000 + 120_000, "ms": pause_ms, "generation": generation, "explicit": explicit,
        "caller": "train.py(9): step" if explicit else None, "training_thread": training_thread,
        **({} if cpu_ms is None else {"cpu_ms": cpu_ms}),
    }
    gc_seen = {
        "enabled": True, "thresholds": [700, 10, 10], "frozen": 0, "min_recorded_ms": 0.5,
        "collections": [collection], "totals": [{"generation": generation, "count": 1, "ms": pause_ms}],
    }
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1, baseTimeNanoseconds=base_ns, **{GC_METADATA_KEY: gc_seen})
    return tmp_path


def test_pauses_under_the_report_share_are_not_a_finding(tmp_path: Path):
    summary = analyze_folder(_one_rank(tmp_path, 15.0))  # 15 ms over four 100 ms steps: under 5%
    assert summary.ranks[0].gc is not None and finding(summary, "gc_pause") is None


def test_one_long_pause_in_a_window_is_said_as_one_steps_and_does_not_warn(tmp_path: Path):
    found = finding(analyze_folder(_one_rank(tmp_path, 60.0)), "gc_pause")
    assert found is not None and found.severity == "info"
    assert "of it is one step's" in found.evidence


def test_a_collection_that_waited_for_a_core_costs_its_work_not_its_wait(tmp_path: Path):
    # A young collection on two shared cores: 40 ms by the clock, 0.2 ms of CPU (told before as a 10% pause).
    summary = analyze_folder(_one_rank(tmp_path, 40.0, generation=0, cpu_ms=0.2))
    assert summary.ranks[0].gc is not None and summary.ranks[0].gc.collections[0].pause_ms == 0.2
    assert finding(summary, "gc_pause") is None


def test_a_collection_that_worked_its_whole_time_is_told_by_it(tmp_path: Path):
    found = finding(analyze_folder(_one_rank(tmp_path, 60.0, cpu_ms=58.0)), "gc_pause")
    assert found is not None and "full collections: rank 0 in step 1 (58 ms)" in found.evidence


def test_a_collection_on_another_thread_costs_its_clock_time_for_it_holds_the_gil_throughout(tmp_path: Path):
    found = finding(analyze_folder(_one_rank(tmp_path, 60.0, training_thread=False, cpu_ms=5.0)), "gc_pause")
    assert found is not None and "1 of them ran on other threads of the process (60 ms)" in found.evidence


def test_a_collection_recorded_without_its_cpu_time_is_told_by_the_clock(tmp_path: Path):
    found = finding(analyze_folder(_one_rank(tmp_path, 60.0)), "gc_pause")
    assert found is not None and "(60 ms)" in found.evidence


def test_a_malformed_record_is_said_and_left_unread(tmp_path: Path):
    events = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), x_event("aten::mm", 10, 900)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1, **{GC_METADATA_KEY: {"collections": "x"}})
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.gc is None
    assert any("garbage collections (rayprof_gc): malformed" in issue for issue in rank.issues)


COLLECTION = st.fixed_dictionaries({
    "start_us": ANY_JSON | st.integers(), "ms": ANY_JSON | st.floats(), "generation": ANY_JSON | st.integers(),
    "explicit": ANY_JSON | st.booleans(), "training_thread": ANY_JSON | st.booleans(),
}, optional={"caller": ANY_JSON | st.text(max_size=20)})
RECORD = st.fixed_dictionaries({
    "enabled": ANY_JSON | st.booleans(), "thresholds": ANY_JSON | st.tuples(st.integers(), st.integers(), st.integers()),
    "frozen": ANY_JSON | st.integers(), "min_recorded_ms": ANY_JSON | st.floats(), "collections": st.lists(COLLECTION, max_size=3),
})


@given(ANY_JSON.filter(lambda raw: raw is not None) | RECORD)
def test_any_json_under_the_gc_key_reads_or_is_refused_with_a_reason(raw):
    seen, why = read_gc({GC_METADATA_KEY: raw})
    assert (seen is None) != (why is None)
    if seen is not None:
        assert all(c.ms >= 0 and 0 <= c.generation <= 2 and c.start_us >= 0 for c in seen.collections)


def test_a_collection_on_another_thread_pauses_the_loop_too_and_is_said(tmp_path: Path):
    found = finding(analyze_folder(_one_rank(tmp_path, 60.0, training_thread=False)), "gc_pause")
    assert found is not None and "1 of them ran on other threads of the process (60 ms)" in found.evidence


def test_a_summary_keeps_a_ranks_longest_collections_in_time_order_and_says_it_kept_them():
    short = [{"start_us": 1000 + i, "ms": 0.6, "generation": 0, "explicit": False, "training_thread": True} for i in range(300)]
    long = [{"start_us": 5000 + i, "ms": 50.0 + i, "generation": 2, "explicit": False, "training_thread": True} for i in range(3)]
    record = {"enabled": True, "thresholds": [700, 10, 10], "frozen": 0, "min_recorded_ms": 0.5, "collections": short + long}
    seen, why = read_gc({GC_METADATA_KEY: record})
    assert why is None and seen is not None and seen.truncated
    assert len(seen.collections) == SUMMARY_COLLECTIONS
    assert [c.ms for c in seen.collections[-3:]] == [50.0, 51.0, 52.0]
    assert [c.start_us for c in seen.collections] == sorted(c.start_us for c in seen.collections)


def _pausing(ranks, pause_ms):
    """``ranks`` with the agent's record of a collection of ``pause_ms(rank, step) `` ms (0: none) early in each step."""
    out = []
    for r in ranks:
        collections = [
            GcCollection(start_us=int(s.start_unix_us) + 100, ms=ms, generation=2, explicit=False, training_thread=True)
            for s in r.steps if (ms := pause_ms(r, s)) > 0
        ]
        record = GcPauses(enabled=True, thresholds=(700, 10, 10), frozen=0, min_recorded_ms=0.5, collections=collections)
        out.append(r.model_copy(update={"gc": record}))
    return out


def test_pauses_that_move_from_rank_to_rank_are_the_collectors_not_uneven_batches():
    # Each step a random rank's forward grows by half a step (benchmarks/culprit.py's planted "moving" set), here
    # because that rank collected then: the agent's record holds a pause of that size on it in that step.
    extra = 0.5 * DLRM.median_step_ms
    ranks, _ = build_set(DLRM, 8, "moving", 0.5, random.Random(3))
    assert moving_imbalance(ranks, []) is not None
    slowest = {s.step: max(ranks, key=lambda r: next(x.phases.forward for x in r.steps if x.step == s.step)).rank for s in ranks[0].steps}
    paused = _pausing(ranks, lambda r, s: extra if slowest[s.step] == r.rank else 0.0)
    assert moving_imbalance(paused, []) is None
    found = gc_pause(paused, [])
    assert found is not None and found.severity == "warning"


def test_a_straggler_whose_own_pauses_are_its_excess_is_the_collectors():
    extra = 0.5 * DLRM.median_step_ms
    ranks, culprits = build_set(DLRM, 8, "forward", 0.5, random.Random(4))
    stragglers = cross_stragglers(ranks)
    assert straggler(ranks, stragglers) is not None
    paused = _pausing(ranks, lambda r, s: extra if r.rank in culprits else 0.0)
    assert straggler(paused, stragglers) is None and gc_pause(paused, stragglers) is not None


def test_a_straggler_slower_for_more_than_its_pauses_is_still_a_straggler():
    small = 0.05 * DLRM.median_step_ms  # a tenth of its excess
    ranks, culprits = build_set(DLRM, 8, "forward", 0.5, random.Random(4))
    stragglers = cross_stragglers(ranks)
    paused = _pausing(ranks, lambda r, s: small if r.rank in culprits else 0.0)
    found = straggler(paused, stragglers)
    assert found is not None and found.ranks == sorted(culprits)


def test_the_loops_python_under_a_collectors_pause_is_the_collectors_not_the_loops():
    # In a Ray worker a stack sample lands as a collection ends and names the line that called gc.collect(): the
    # loop's own Python by its frames, the collector's by the agent's record.
    ranks = analyze_folder(case("cpu_python_tokenize")).ranks
    assert host_python(ranks, []) is not None
    paused = _pausing(ranks, lambda r, s: s.python_ms)
    assert host_python(paused, []) is None and gc_pause(paused, []) is not None
