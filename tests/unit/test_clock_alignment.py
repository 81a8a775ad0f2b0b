"""Issue 24 item 4: the merged timeline's clock alignment, proven on clocks moved by known amounts.

Each rank's clock is moved by a random offset of -50 ms to +50 ms and a drift
of up to 100 ppm over the window (``ts' = ts + offset + drift * (ts - t0)``, t0
the rank's first event), on PARAM's real 8-rank DLRM (one host: its ranks share
one clock, so the truth is the files as recorded) and on a synthetic 16-rank
job over 2 s (where a drift of 100 ppm moves a clock by 200 µs, which a
shift alone cannot undo). Then:

* the merge puts every rank back within 20 µs of where it belongs (on the
  collectives and the step starts);
* the error bound each rank reports (``residual_us``) is at least the true
  error on its collectives;
* who arrives late and who waits (and the straggler verdicts) are those of
  the unmoved files.

Hypothesis draws the clocks, derandomized with few examples: the same
examples run every time, in a few seconds.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestrator.analysis import Summary, analyze_for_merge
from orchestrator.models.merge_stats import MergeStats
from orchestrator.traces.discover import discover_traces
from orchestrator.traces.merge import PID_STRIDE, merge_traces
from tests.support.tracefiles import load_trace, shared, write_trace, x_event

Clock = tuple[float, float]  # (offset µs, drift as a fraction)
MAX_OFFSET_US = 50_000.0
MAX_DRIFT = 100e-6
TOLERANCE_US = 20.0
SYNTHETIC_RANKS = 16
LATE_RANK = 3


def _clocks(ranks: int) -> st.SearchStrategy[list[Clock]]:
    clock = st.tuples(st.floats(-MAX_OFFSET_US, MAX_OFFSET_US), st.floats(-MAX_DRIFT, MAX_DRIFT))
    return st.lists(clock, min_size=ranks, max_size=ranks)


def _moved(ts: float, clock: Clock, t0: float) -> float:
    offset, drift = clock
    return ts + offset + drift * (ts - t0)


def _first_ts(doc: dict[str, Any]) -> float:
    return min(e["ts"] for e in doc["traceEvents"] if isinstance(e.get("ts"), int | float))


def _write_moved(docs: dict[int, dict[str, Any]], clocks: list[Clock], folder: Path) -> Path:
    """Each rank's trace with its clock moved (uncompressed: the fastest to write and read)."""
    folder.mkdir()
    for rank, doc in docs.items():
        t0 = _first_ts(doc)
        events = []
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), int | float):
                e = {**e, "ts": _moved(e["ts"], clocks[rank], t0)}
                if isinstance(e.get("dur"), int | float):
                    e["dur"] = e["dur"] * (1 + clocks[rank][1])
            events.append(e)
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps({**doc, "traceEvents": events}))
    return folder


def _analyse_and_merge(folder: Path) -> tuple[Summary, MergeStats]:
    traces = discover_traces(folder)
    summary, scans = analyze_for_merge(traces)
    return summary, merge_traces(traces, folder / "merged.trace.json.gz", scans=scans)


def _verdicts(summary: Summary) -> tuple[Any, ...]:
    spread = summary.step_spread
    assert spread is not None
    return spread.late_ranks, spread.waiting_ranks, [(s.rank, s.cause) for s in summary.stragglers]


def _collective_ends(doc: dict[str, Any]) -> list[float]:
    return [e["ts"] + e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]


def _step_starts(doc: dict[str, Any]) -> list[float]:
    return [e["ts"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


def alignment_errors(docs: dict[int, dict[str, Any]], clocks: list[Clock], stats: MergeStats) -> dict[int, dict[str, float]]:
    """Per rank: the largest error (µs) of the merged clock against the truth (the files before the clocks
    were moved), on its collectives and on its step starts too, and the bound it reports."""
    by_rank = {a.rank: a for a in stats.alignment}
    root = docs[0]
    out = {}
    for rank, doc in docs.items():
        a, t0, root_t0 = by_rank[rank], _first_ts(doc), _first_ts(root)

        def error(t: float, a=a, rank=rank, t0=t0, root_t0=root_t0) -> float:
            # Where the merge puts true time t on this rank, against where it puts it on rank 0.
            here = a.merged_us(_moved(t, clocks[rank], t0))
            return abs(here - by_rank[0].merged_us(_moved(t, clocks[0], root_t0)))

        on_collectives = max(map(error, _collective_ends(doc)))
        out[rank] = {
            "collectives": on_collectives,
            "window": max(on_collectives, *map(error, _step_starts(doc))),
            "bound": a.residual_us if a.residual_us is not None else float("inf"),
        }
    return out


def check(docs: dict[int, dict[str, Any]], clocks: list[Clock], tmp: Path, expected: tuple[Any, ...]) -> dict[int, dict[str, float]]:
    summary, stats = _analyse_and_merge(_write_moved(docs, clocks, tmp))
    errors = alignment_errors(docs, clocks, stats)
    assert all(a.method == "collectives" for a in stats.alignment) and stats.alignment_note is None
    for rank, e in errors.items():
        assert e["window"] <= TOLERANCE_US, (rank, e, clocks[rank])
        assert e["collectives"] <= e["bound"], (rank, e, clocks[rank])
    assert _verdicts(summary) == expected
    return errors


# PARAM's DLRM: 8 ranks on one host, one common step, 8 NCCL kernels each.

@functools.cache
def dlrm_docs() -> dict[int, dict[str, Any]]:
    files = sorted(shared("external-traces", "param_dlrm_v100_8ranks", "traces").glob("*.pt.trace.json.gz"))
    docs = [load_trace(p) for p in files]
    return {doc["distributedInfo"]["rank"]: doc for doc in docs}


@functools.cache
def dlrm_verdicts() -> tuple[Any, ...]:
    traces = discover_traces(shared("external-traces", "param_dlrm_v100_8ranks", "traces"))
    return _verdicts(analyze_for_merge(traces)[0])


def test_the_unmoved_dlrm_verdicts_are_the_known_ones() -> None:
    # Ranks 2, 6 and 7 start the step last; the others wait for them in the all-to-all.
    late = [(2, "late_arrival"), (6, "late_arrival"), (7, "late_arrival")]
    assert dlrm_verdicts() == ([2, 6, 7], [0, 1, 3, 4, 5], late)


@settings(max_examples=3, derandomize=True, deadline=None, database=None)
@given(clocks=_clocks(8))
@example(clocks=[(MAX_OFFSET_US * (-1) ** r, MAX_DRIFT * (-1) ** (r // 2)) for r in range(8)])
def test_dlrm_ranks_moved_by_known_clocks_are_put_back(tmp_path_factory: Any, clocks: list[Clock]) -> None:
    check(dlrm_docs(), clocks, tmp_path_factory.mktemp("dlrm") / "moved", dlrm_verdicts())


# A synthetic lockstep job: 16 ranks, 20 steps of 100 ms; rank 3 starts each step 20 ms late and the
# others wait for it in the allreduce, whose kernel ends on every rank within ±2 µs of one instant.

def lockstep_docs(ranks: int = SYNTHETIC_RANKS, steps: int = 20, step_us: float = 100_000.0) -> dict[int, dict[str, Any]]:
    jitter = random.Random(24)
    origin = 1_700_000_000_000_000.0
    docs = {}
    for rank in range(ranks):
        lag = 20_000.0 if rank == LATE_RANK else (37 * rank) % 300
        events: list[dict[str, Any]] = []
        for k in range(steps):
            start = origin + k * step_us + lag
            together = origin + k * step_us + 80_000.0 + jitter.uniform(-2, 2)
            events += [
                x_event(f"ProfilerStep#{k + 1}", start, origin + k * step_us + 81_000.0 - start),
                x_event("aten::mm", start + 100, 55_000),
                x_event("volta_sgemm_128x64_nn", start + 200, 55_000, cat="kernel", pid=0, tid=7),
                x_event("ncclKernel_AllReduce_RING_LL_Sum_float", start + 55_300, together - start - 55_300, cat="kernel", pid=0, tid=7),
            ]
        docs[rank] = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks}, "traceEvents": events}
    return docs


LOCKSTEP_VERDICTS = ([LATE_RANK], [r for r in range(SYNTHETIC_RANKS) if r != LATE_RANK], [(LATE_RANK, "late_arrival")])


def test_the_unmoved_lockstep_job_has_one_late_rank(tmp_path: Path) -> None:
    clocks = [(0.0, 0.0)] * SYNTHETIC_RANKS
    errors = check(lockstep_docs(), clocks, tmp_path / "as_generated", LOCKSTEP_VERDICTS)
    assert max(e["window"] for e in errors.values()) < 5


@settings(max_examples=5, derandomize=True, deadline=None, database=None)
@given(clocks=_clocks(SYNTHETIC_RANKS))
@example(clocks=[(MAX_OFFSET_US * (-1) ** r, MAX_DRIFT * (-1) ** (r // 2)) for r in range(SYNTHETIC_RANKS)])
def test_lockstep_ranks_moved_by_known_clocks_are_put_back(tmp_path_factory: Any, clocks: list[Clock]) -> None:
    docs = lockstep_docs()
    folder = tmp_path_factory.mktemp("lockstep") / "moved"
    errors = check(docs, clocks, folder, LOCKSTEP_VERDICTS)
    # The merged file itself: each rank's step starts where the truth puts it against rank 0's, within its bound.
    merged = load_trace(folder / "merged.trace.json.gz")
    starts: dict[int, list[float]] = {}
    for e in merged["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            starts.setdefault(e["pid"] // PID_STRIDE - 1, []).append(e["ts"])
    truth = {rank: _step_starts(doc) for rank, doc in docs.items()}
    for rank, got in starts.items():
        for k, ts in enumerate(sorted(got)):
            assert abs((ts - sorted(starts[0])[k]) - (truth[rank][k] - truth[0][k])) <= errors[rank]["bound"] + 1


def test_ranks_that_share_no_collectives_are_said_to_stand_on_wall_clocks(tmp_path: Path) -> None:
    for rank in (0, 1):
        events = [x_event("ProfilerStep#1", 1_000 + 500 * rank, 10_000), x_event("aten::mm", 1_100 + 500 * rank, 5_000)]
        write_trace(tmp_path / f"rank{rank}.pt.trace.json", events, rank=rank)
    summary, stats = _analyse_and_merge(tmp_path)
    assert [a.method for a in stats.alignment] == ["base time", "base time"]
    assert stats.alignment_note is not None and "wall clocks only" in stats.alignment_note
    assert "NTP" in stats.alignment_note and stats.alignment_note in summary.issues


def test_ranks_that_share_collectives_only_among_themselves_form_a_group_on_its_own(tmp_path: Path) -> None:
    # Ranks 0 and 2 share an allreduce, 1 and 3 an all-to-all (two jobs in one folder): each pair is aligned
    # on its own collectives, the pairs against each other on wall clocks only.
    for rank in range(4):
        name = "ncclKernel_AllReduce_RING_LL" if rank % 2 == 0 else "ncclKernel_SendRecv_RING_SIMPLE"
        skew = 300.0 * rank  # each rank's clock reads this much late
        events = [x_event("ProfilerStep#1", 1_000 + skew, 10_000)]
        events += [x_event(name, 2_000 + 1_000 * k + skew, 500, cat="kernel", pid=0, tid=7) for k in range(3)]
        write_trace(tmp_path / f"rank{rank}.pt.trace.json", events, rank=rank, world_size=4)
    summary, stats = _analyse_and_merge(tmp_path)
    got = [(a.method, a.reference, round(a.shift_us), a.residual_us) for a in stats.alignment]
    assert got == [("collectives", None, 0, 0.0), ("base time", None, 0, None), ("collectives", 0, -600, 1.0), ("collectives", 1, -600, 1.0)]
    note = stats.alignment_note
    assert note is not None and note.startswith("ranks 1, 3 share no collectives with rank 0: aligned with it on wall clocks only")
    assert note.endswith("; rank 3 is aligned on the collectives of their own group") and note in summary.issues
