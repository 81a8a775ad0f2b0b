"""Pipeline parallelism as torch.distributed.pipelining runs it, on two gloo ranks (one stage each):
tests/data/record_cpu_pipeline.py recorded the traces (torch 2.13.0+cpu).

A stage sends each micro-batch's activations (gradients, going back) asynchronously and computes the next one while
they travel; gloo's record of each send lasts until it completes, across those ops. The host waits only where it
runs none of its own ops; the ops inside are their phases. A stage slower than the others holds the whole pipeline
to its pace, and the change is where the model is split, not what differs on that rank.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict

from orchestrator.analysis import Summary, analyze_folder, analyze_for_merge
from orchestrator.analysis.comm_time import comm_time
from orchestrator.analysis.spans import by_kind
from orchestrator.traces.discover import discover_traces
from orchestrator.traces.loader import Span, load_rank
from orchestrator.traces.merge import merge_traces
from tests.support.tracefiles import case

_MICRO_BATCH = re.compile(r"^(Forward|Backward) \d+$")  # pipelining's record_function per micro-batch


@functools.cache
def analysed(name: str) -> Summary:
    return analyze_folder(case(name))


def compute_ms_per_step(name: str, rank: int) -> dict[str, float]:
    """Per step, the time the rank's main thread runs the model's own ops inside pipelining's "Forward N" and
    "Backward N" regions (their top-level ops, collectives left out), by phase."""
    trace = next(t for t in discover_traces(case(name)).files if t.path.name.startswith(f"rank{rank}."))
    spans = load_rank(trace).spans
    steps = [s for s in spans if s.name.startswith("ProfilerStep#")]
    main = sorted((s for s in spans if s.tid == steps[0].tid and s.cat == "cpu_op"), key=lambda s: s.ts)
    regions = [s for s in spans if s.tid == steps[0].tid and _MICRO_BATCH.match(s.name)]
    out: dict[str, float] = defaultdict(float)
    for region in regions:
        phase = region.name.split()[0].lower()
        tops: list[Span] = []
        for op in main:
            inside = region.ts <= op.ts and op.end <= region.end
            if inside and not op.name.startswith("c10d::") and not any(t.ts <= op.ts and op.end <= t.end for t in tops[-1:]):
                tops.append(op)
        out[phase] += sum(op.end - op.ts for op in tops) / 1000 / len(steps)
    return dict(out)


def test_a_stage_computing_while_its_sends_travel_is_computing_not_communicating():
    # Before: GPipe's first stage read 2.8 ms of forward a step, where its model ops alone ran 6.8 ms: they lay inside
    # the records of sends still in flight, read as communication.
    summary = analysed("pipeline_gpipe")
    for rank in summary.ranks:
        ran = compute_ms_per_step("pipeline_gpipe", rank.rank)
        assert rank.mean_phases.forward >= ran["forward"] > 0
        assert rank.mean_phases.backward >= ran["backward"] > 0


def test_the_host_waits_inside_a_work_record_only_where_it_runs_no_op_of_its_own():
    def span(ts: float, end: float, name: str, cat: str = "cpu_op") -> Span:
        return Span(ts=ts, end=end, name=name, cat=cat, pid=1, tid=1)

    main = [
        span(0, 100, "gloo:send", "user_annotation"),  # a send issued at 0, completed at 100
        span(10, 40, "Forward 1", "user_annotation"),  # the next micro-batch, computed while it travels
        span(12, 38, "aten::addmm"),
        span(50, 60, "c10d::send"),  # another collective call: the host is in it
        span(55, 58, "aten::empty"),
    ]

    assert comm_time(main, by_kind(main)) == [(0, 10), (40, 100)]


def test_a_pipelines_slowest_stage_is_told_to_move_its_split_point():
    # Three blocks on the first stage, one and the head on the second.
    summary = analysed("pipeline_uneven")
    first = summary.findings[0]
    assert (first.code, first.ranks) == ("straggler", [0])
    assert first.title == "Rank 0's pipeline stage is the slowest (backward)"
    assert "sends and receives lead its collectives" in first.evidence
    assert "move layers from its stage to a neighbouring one" in first.fix and "split_spec" in first.fix
    assert "Find what differs on that rank" not in first.fix


def test_a_pipelines_ranks_are_not_aligned_on_their_sends_and_receives(tmp_path):
    # One host, one clock: the truth is the files as recorded. Matched by name and count, the first stage's k-th
    # send (activations) met the last stage's k-th send (gradients): rank 1 moved by -3.7 ms, bound +-49 ms.
    traces = discover_traces(case("pipeline_gpipe"))
    summary, scans = analyze_for_merge(traces)
    stats = merge_traces(traces, tmp_path / "merged.trace.json.gz", scans=scans)

    assert [(a.method, a.shift_us) for a in stats.alignment] == [("base time", 0.0), ("base time", 0.0)]
    assert stats.alignment_note is not None and stats.alignment_note in summary.issues
