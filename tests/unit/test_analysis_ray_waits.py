"""Steps that wait in Ray's own code, named from the agent's stack samples or a with_stack trace's frames.

Recorded by tests/data/record_ray_loops.py (Ray Train on a local Ray, the agent's sampler in each trace):
cpu_ray_data (a step waiting ~150 ms for Ray Data's next batch), cpu_ray_data_stack (the same with_stack),
cpu_ray_data_fast (Ray Data keeping ahead), cpu_train_report (ray.train.report() every step, Ray Train 2) and
cpu_train_report_v1 (the same under Ray Train 1).
Before these rules the waits read as the model's forward, and the report said nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.intervals import intersect, union
from orchestrator.analysis.untraced import RAY_DATA_ITERATOR, Timeline, Untraced, kind_of, read_samples, untraced_waits
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from tests.support.tracefiles import case, load_trace

RAY_DATA_STACK = [
    "threading.py(331): wait",
    "queue.py(171): get",
    "ray/data/_internal/block_batching/util.py(158): iter_threaded",
    "ray/data/iterator.py(293): _create_iterator",
    "train.py(40): train_func",
]
REPORT_STACK = [
    "queue.py(140): put",
    "ray/train/v2/_internal/execution/context.py(397): _wait_then_report",
    "ray/train/v2/_internal/execution/context.py(517): report",
    "ray/train/v2/api/train_fn_utils.py(125): report",
    "train.py(44): train_func",
]


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def test_a_step_waiting_for_ray_data_is_data_loading_from_the_agents_samples():
    summary = analyze_folder(case("cpu_ray_data"))
    (r,) = summary.ranks
    assert r.data_loader == RAY_DATA_ITERATOR
    assert r.mean_phases.data > 0.9 * r.mean_step_ms and r.mean_phases.forward < 0.1 * r.mean_step_ms
    found = summary.findings[0]
    assert found.code == "dataloader_bound" and found.severity == "warning"
    assert found.evidence.startswith("Ray Data's iterator (the next batch) takes")


def test_the_fix_for_a_ray_data_wait_is_ray_datas_not_the_dataloaders():
    found = finding(analyze_folder(case("cpu_ray_data")), "dataloader_bound")
    assert "map_batches(fn, concurrency=N)" in found.fix and "prefetch_batches" in found.fix
    assert "num_workers" not in found.fix and "persistent_workers" not in found.fix


def test_a_with_stack_trace_names_the_ray_data_wait_from_its_own_frames(tmp_path):
    folder = _without_samples(case("cpu_ray_data_stack"), tmp_path)
    summary = analyze_folder(folder)
    (r,) = summary.ranks
    assert r.data_loader == RAY_DATA_ITERATOR and r.mean_phases.data > 0.9 * r.mean_step_ms
    assert "iter_threaded (ray/data/_internal/block_batching/util.py:158)" in summary.findings[0].evidence


def test_without_samples_or_frames_the_wait_is_not_named(tmp_path):
    # What every trace said before the agent sampled: the empty stretch is the unmarked forward's.
    (r,) = analyze_folder(_without_samples(case("cpu_ray_data"), tmp_path)).ranks
    assert r.data_loader is None and r.mean_phases.data == 0.0


def test_ray_data_keeping_ahead_of_the_step_is_no_finding():
    summary = analyze_folder(case("cpu_ray_data_fast"))
    (r,) = summary.ranks
    assert r.data_loader == RAY_DATA_ITERATOR and summary.findings == []


def test_reporting_every_step_to_ray_train_2_is_told_with_the_controllers_poll():
    summary = analyze_folder(case("cpu_train_report"))
    found = summary.findings[0]
    assert found.code == "train_report" and found.severity == "warning" and found.ranks == [0, 1]
    assert found.evidence.startswith("The training thread waits in ray.train.report() in every step on rank")
    assert "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" in found.evidence
    assert found.fix.startswith("Report every N steps")
    assert all(r.ray_train == 2 for r in summary.ranks)


def test_reporting_every_step_to_ray_train_1_is_told_as_far_as_the_samples_catch_it():
    # Train 1's report hands over to the driver in a few ms: samples every 10 ms catch it in some steps only.
    found = finding(analyze_folder(case("cpu_train_report_v1")), "train_report")
    assert found is not None and found.severity == "info"
    assert "so it may be in more" in found.evidence and "In Ray Train 1 each report()" in found.evidence
    assert "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" not in found.fix


def test_the_report_wait_is_other_time_not_the_forward():
    for r in analyze_folder(case("cpu_train_report")).ranks:
        report = sum(s.report_ms for s in r.steps) / len(r.steps)
        assert report > 0.9 * r.mean_step_ms
        assert r.mean_phases.other >= report and r.mean_phases.forward < 0.05 * r.mean_step_ms


def test_jobs_that_never_report_to_ray_train_get_no_report_finding():
    for name in ("cpu_ray_data", "healthy", "dataloader_bound", "cpu_hf_trainer"):
        summary = analyze_folder(case(name))
        assert finding(summary, "train_report") is None
        assert all(r.ray_train is None and all(s.report_ms == 0 for s in r.steps) for r in summary.ranks)


def test_a_ray_data_wait_sampled_in_a_real_ray_worker_is_named():
    # The stacks the recorder's Ray Train worker gave (tests/data/traces/cpu_ray_data): Ray Data's iterator on top
    # of the loop that Ray Train runs.
    trace = load_trace(case("cpu_ray_data") / "traces" / "rank0.pt.trace.json.gz")
    samples = FrameSamples.model_validate(trace[FRAMES_METADATA_KEY])
    named = [kind_of(samples.stacks[i]) for _, i in samples.samples]
    assert named.count(Untraced.RAY_DATA) > 0.8 * len(named)


def test_the_innermost_ray_frame_names_the_stack():
    assert kind_of(RAY_DATA_STACK) is Untraced.RAY_DATA
    assert kind_of(REPORT_STACK) is Untraced.TRAIN_REPORT
    assert kind_of(["train.py(40): train_func", "ray/train/v2/_internal/util.py(89): train_fn"]) is None
    assert kind_of(["<built-in method acquire>", "not a frame"]) is None


def test_a_gap_is_split_halfway_between_samples_of_different_kinds():
    samples = FrameSamples(
        interval_ms=10, stacks=[REPORT_STACK, RAY_DATA_STACK, ["train.py(50): log"]],
        samples=[(1_000_010, 0), (1_000_020, 0), (1_000_030, 2), (1_000_040, 1), (1_000_050, 1)],
    )
    waits = untraced_waits([], Timeline.of(samples, base_us=1_000_000), gaps=[(5.0, 60.0), (70.0, 90.0)])
    assert waits[Untraced.TRAIN_REPORT] == [(5.0, 25.0)]  # to halfway towards the unnamed sample at 30
    assert waits[Untraced.RAY_DATA] == [(35.0, 60.0)]  # from halfway after it, out to the gap's end
    # A gap no sample lands in stays unnamed.
    assert all(b <= 60.0 for spans in waits.values() for _, b in spans)


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.sampled_from([0, 1, 2])), max_size=40, unique_by=lambda p: p[0]),
    st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200)), max_size=6),
)
def test_named_stretches_lie_in_the_gaps_and_cover_every_sample_of_their_kind(points, spans):
    # One sample at a time (the sampler takes them in turn): two kinds at the same instant split nothing.
    gaps = union((float(a), float(a + n)) for a, n in spans)
    samples = FrameSamples(interval_ms=5, stacks=[REPORT_STACK, RAY_DATA_STACK, ["train.py(50): log"]],
                           samples=[(t, i) for t, i in points])
    waits = untraced_waits([], Timeline.of(samples, base_us=0), gaps)
    for kind, index in ((Untraced.TRAIN_REPORT, 0), (Untraced.RAY_DATA, 1)):
        assert intersect(waits[kind], gaps) == waits[kind]
        for t, i in points:
            if i == index and any(a <= t < b for a, b in gaps):
                assert any(a <= t <= b for a, b in waits[kind]), (t, waits[kind])
    assert intersect(waits[Untraced.TRAIN_REPORT], waits[Untraced.RAY_DATA]) == []


def test_a_trace_without_samples_reads_none_and_says_nothing():
    assert read_samples({"schemaVersion": 1}) == (None, None)


def test_malformed_samples_are_skipped_with_a_reason():
    samples, why = read_samples({FRAMES_METADATA_KEY: {"interval_ms": 10, "stacks": [["a.py(1): f"]], "samples": [[5, 3]]}})
    assert samples is None and "stack samples (rayprof_frames): malformed" in why and "past the 1 given" in why


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20).filter(lambda raw: raw is not None))
def test_any_json_under_the_samples_key_reads_or_is_refused_with_a_reason(raw):
    samples, why = read_samples({FRAMES_METADATA_KEY: raw})
    assert (samples is None) != (why is None)


def test_a_malformed_sample_record_costs_the_trace_its_names_not_its_analysis(tmp_path):
    folder = _without_samples(case("cpu_ray_data"), tmp_path, replace={"interval_ms": -1})
    summary = analyze_folder(folder)
    (r,) = summary.ranks
    assert r.mean_step_ms > 0 and any("stack samples (rayprof_frames): malformed" in i for i in r.issues)


def _without_samples(folder: Path, tmp_path: Path, replace: object | None = None) -> Path:
    """A copy of ``folder`` whose traces hold no stack samples (or ``replace`` in their place)."""
    import gzip

    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    for path in (out / "traces").glob("*.json.gz"):
        trace = load_trace(path)
        if replace is None:
            trace.pop(FRAMES_METADATA_KEY, None)
        else:
            trace[FRAMES_METADATA_KEY] = replace
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(trace, f)
    return out
