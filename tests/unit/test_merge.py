"""Merging rank traces into one Chrome/Perfetto trace."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from orchestrator.traces.discover import discover_traces
from orchestrator.traces.merge import ID_STRIDE, merge_folder, merge_traces
from orchestrator.traces.merge_plan import COMM, SPAN, classify
from tests.support.tracefiles import case, shared, write_trace, x_event


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def processes(doc: dict[str, Any]) -> list[tuple[int, str]]:
    """(sort index, name) of every process, in sort order."""
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"] if e.get("name") == "process_sort_index"}
    return sorted((order[pid], name) for pid, name in names.items())


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("merge") / "merged.trace.json.gz"
    merge_folder(case("straggler"), out)
    return load(out)


def test_merge_never_writes_through_a_link_planted_at_its_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "merged.trace.json.gz"
    (tmp_path / ".merged.trace.json.gz.tmp").symlink_to(victim)

    merge_folder(case("straggler"), out)

    assert victim.read_text() == "keep me"
    assert not out.is_symlink() and load(out)["traceEvents"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == [".merged.trace.json.gz.tmp"]


def test_merged_trace_has_one_process_per_rank_sorted(merged: dict[str, Any]) -> None:
    mains = [name for _, name in processes(merged) if not name.split(")")[-1].strip()]
    assert mains == ["rank 0 (vm)", "rank 1 (vm)"]
    # Every process of rank 0 sorts before every process of rank 1.
    assert [name.split()[1] for _, name in processes(merged)] == sorted(name.split()[1] for _, name in processes(merged))


def test_merged_pids_never_collide_across_ranks(merged: dict[str, Any]) -> None:
    pids_by_rank = defaultdict(set)
    for rank in merged["rayprof"]["ranks"]:
        pids_by_rank[rank["rank"]] = set(rank["pids"].values())
    assert not pids_by_rank[0] & pids_by_rank[1]
    steps = Counter(e["pid"] for e in merged["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert len(steps) == 2 and set(steps.values()) == {4}


def test_merged_flow_ids_unique_per_rank(merged: dict[str, Any]) -> None:
    flows = defaultdict(list)
    for e in merged["traceEvents"]:
        if e.get("ph") in ("s", "f"):
            flows[(e["id"], e["ph"])].append(e["pid"])
    assert flows, "the fixture has fwdbwd flows"
    # Each flow start and end occurs once, and both ends of a flow stay in one rank.
    assert all(len(pids) == 1 for pids in flows.values())
    ends = {flow_id: pids[0] // 1000 for (flow_id, ph), pids in flows.items() if ph == "f"}
    assert all(ends[flow_id] == pids[0] // 1000 for (flow_id, ph), pids in flows.items() if ph == "s")
    assert {flow_id // ID_STRIDE for flow_id, _ in flows} == {0, 1}


def test_merged_external_ids_are_unique_per_rank(merged: dict[str, Any]) -> None:
    ids = [e["args"]["External id"] for e in merged["traceEvents"] if "External id" in e.get("args", {})]
    by_rank = Counter(i // ID_STRIDE for i in ids)
    assert set(by_rank) == {0, 1}


def test_merged_steps_line_up_on_the_wall_clock(merged: dict[str, Any]) -> None:
    starts = defaultdict(dict)
    for e in merged["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            starts[e["name"]][e["pid"]] = e["ts"]
    # The ranks ran the same steps at the same time; DDP keeps them within a few ms.
    assert all(max(t.values()) - min(t.values()) < 10_000 for t in starts.values())


def write(path: Path, rank: int, base_ns: int, events: list[dict[str, Any]]) -> Path:
    doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "baseTimeNanoseconds": base_ns, "deviceProperties": [{"id": 0}], "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_clocks_are_aligned_through_base_time(tmp_path: Path) -> None:
    # The same wall-clock instant, written against two different base times.
    write(tmp_path / "rank0.pt.trace.json", 0, 1_000_000_000, [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 500.0, "dur": 1}])
    write(tmp_path / "rank1.pt.trace.json", 1, 1_000_200_000, [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 300.0, "dur": 1}])
    out = tmp_path / "m.json.gz"
    merge_folder(tmp_path, out)
    doc = load(out)
    assert doc["baseTimeNanoseconds"] == 1_000_000_000
    assert [e["ts"] for e in doc["traceEvents"] if e["name"] == "a"] == [500.0, 500.0]
    assert [p["rank"] for p in doc["deviceProperties"]] == [0, 1]


def test_duplicate_rank_is_skipped_with_reason(tmp_path: Path) -> None:
    out = tmp_path / "m.json.gz"
    stats = merge_folder(case("duplicate_rank"), out)
    assert stats.ranks == [0]
    assert {(s.rank, s.path.name) for s in stats.skipped} == {(1, "worker-b.pt.trace.json.gz"), (1, "worker-c.pt.trace.json.gz")}
    assert all("duplicate rank 1" in s.reason for s in stats.skipped)


def test_explicit_tuples_with_duplicate_rank_are_skipped(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", 0, 0, [])
    b = write(tmp_path / "b.json", 0, 0, [])
    stats = merge_traces([(0, "h", a), (0, "h", b)], tmp_path / "m.json.gz")
    assert stats.ranks == [] and len(stats.skipped) == 2


def test_damaged_rank_keeps_valid_output_and_is_reported(tmp_path: Path) -> None:
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": float(i), "dur": 1} for i in range(100)]
    text = json.dumps({"distributedInfo": {"rank": 1, "world_size": 2}, "baseTimeNanoseconds": 0, "traceEvents": events})
    (tmp_path / "rank1.pt.trace.json").write_text(text[: len(text) // 2])
    write(tmp_path / "rank0.pt.trace.json", 0, 0, events[:3])
    out = tmp_path / "m.json.gz"
    stats = merge_folder(tmp_path, out)
    doc = load(out)  # still valid JSON
    (damaged,) = stats.truncated
    assert damaged.rank == 1 and "damaged after" in damaged.reason
    assert ("rank 1 (unknown host) [truncated]") in [name for _, name in processes(doc)]
    assert stats.ranks == [0, 1] and 3 < stats.events < 103


def test_merge_stats_count_what_was_written(tmp_path: Path) -> None:
    out = tmp_path / "m.json.gz"
    stats = merge_folder(case("healthy"), out)
    doc = load(out)
    metadata = sum(1 for e in doc["traceEvents"] if e.get("name") in ("process_name", "process_sort_index"))
    assert stats.events == len(doc["traceEvents"]) - metadata
    assert stats.output_bytes == out.stat().st_size
    assert stats.input_bytes == sum(f.path.stat().st_size for f in discover_traces(case("healthy")).files)
    assert not list(tmp_path.glob(".*tmp"))  # written under a temporary name, renamed


def big_trace(path: Path, rank: int, events: int) -> int:
    """A plain-JSON trace of ``events`` ~200-byte events, written piecewise; returns its size."""
    with open(path, "w") as f:
        f.write(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "baseTimeNanoseconds": 0})[:-1] + ',"traceEvents":[')
        template = (
            '{{"ph":"X","cat":"cpu_op","name":"aten::op{op}","pid":7,"tid":7,"ts":{ts},"dur":1.5,'
            '"args":{{"External id":{i},"Record function id":0,"Ev Idx":{i}}}}}'
        )
        f.write(",".join(template.format(op=i % 50, ts=i * 2.0, i=i) for i in range(events)))
        f.write("]}")
    return path.stat().st_size


def merge_peak(folder: Path, events: int) -> tuple[int, int]:
    """(tracemalloc peak of a merge, input bytes) for two ranks of ``events`` events each."""
    folder.mkdir()
    size = sum(big_trace(folder / f"rank{r}.pt.trace.json", r, events) for r in (0, 1))
    tracemalloc.start()
    try:
        stats = merge_folder(folder, folder / "m.json.gz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.events == 2 * events
    return peak, size


def test_merge_memory_does_not_grow_with_the_traces(tmp_path: Path) -> None:
    small, _ = merge_peak(tmp_path / "small", 20_000)
    big, size = merge_peak(tmp_path / "big", 80_000)
    # Four times the input, about the same peak: one batch of one rank is held at a time.
    assert big < small * 1.5, f"peak {small} -> {big} bytes for 4x the input"
    assert big < size / 2


def budget_rank(path: Path, rank: int, clock_error_us: float = 0.0) -> Path:
    """Two steps with many short ops, a few long ones, NCCL collectives, copies and flows."""
    events: list[dict[str, Any]] = []
    for step in range(2):
        t0 = step * 10_000.0 + clock_error_us
        events.append(x_event(f"ProfilerStep#{step + 5}", t0, 10_000, cat="user_annotation"))
        events += [x_event(f"aten::short{i % 7}", t0 + i, 0.5) for i in range(2000)]
        events += [x_event("aten::long", t0 + 3000 + i, 800.0) for i in range(3)]
        events.append(x_event("ncclKernel_AllReduce_RING", t0 + 5000, 2000.0 - 50 * rank, cat="kernel", pid=0, tid=7))
        events.append(x_event("Memcpy HtoD (Pageable -> Device)", t0 + 100, 3.0, cat="gpu_memcpy", pid=0, tid=7))
        events += [{"ph": "s", "id": i, "pid": 1, "tid": 1, "ts": t0 + i, "cat": "ac2g", "name": "ac2g"} for i in range(300)]
    return write_trace(path, events, rank=rank, baseTimeNanoseconds=10**18)


def test_merge_within_budget_keeps_every_event(tmp_path: Path) -> None:
    for r in (0, 1):
        budget_rank(tmp_path / f"rank{r}.pt.trace.json", r)
    stats = merge_folder(tmp_path, tmp_path / "m.json.gz", max_bytes=64 << 20)
    assert stats.dropped is None and stats.events == 2 * 2 * (1 + 2000 + 3 + 2 + 300)
    assert load(tmp_path / "m.json.gz")["rayprof"]["dropped"] is None


def test_merge_over_budget_keeps_markers_collectives_copies_and_the_longest_ops(tmp_path: Path) -> None:
    for r in (0, 1):
        budget_rank(tmp_path / f"rank{r}.pt.trace.json", r)
    stats = merge_folder(tmp_path, tmp_path / "m.json.gz", max_bytes=200_000)
    doc = load(tmp_path / "m.json.gz")
    names = Counter(e.get("name") for e in doc["traceEvents"])
    assert stats.output_raw_bytes <= 200_000
    assert names["ProfilerStep#5"] == names["ProfilerStep#6"] == 2
    assert names["ncclKernel_AllReduce_RING"] == names["Memcpy HtoD (Pageable -> Device)"] == 4
    assert names["aten::long"] == 12 and names["ac2g"] == 0
    assert sum(n for name, n in names.items() if str(name).startswith("aten::short")) < 8000
    assert stats.dropped is not None and stats.dropped.by_kind["flows, instants and counters"] == 1200
    assert stats.dropped.min_span_us is not None and stats.dropped.min_span_us > 0.5
    assert doc["rayprof"]["dropped"] == stats.dropped.model_dump()


def test_merge_budget_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget_rank(tmp_path / "rank0.pt.trace.json", 0)
    monkeypatch.setenv("RAYPROF_MAX_MERGED_BYTES", "150000")
    stats = merge_folder(tmp_path, tmp_path / "m.json.gz")
    assert stats.max_bytes == 150_000 and stats.output_raw_bytes <= 150_000


def test_ranks_are_aligned_on_collective_end_times(tmp_path: Path) -> None:
    # Rank 1's clock runs 700 µs late; its collectives start later but end with rank 0's.
    budget_rank(tmp_path / "rank0.pt.trace.json", 0)
    budget_rank(tmp_path / "rank1.pt.trace.json", 1, clock_error_us=700.0)
    stats = merge_folder(tmp_path, tmp_path / "m.json.gz")
    rank1 = stats.alignment[1]
    assert rank1.method == "collectives" and rank1.matched == 2
    assert rank1.shift_us == pytest.approx(-650.0) and rank1.max_residual_us == pytest.approx(0.0)
    # The error bound: nothing left over after the fit, but the timestamps are whole microseconds.
    assert rank1.reference == 0 and rank1.residual_us == pytest.approx(1.0)


def test_without_collectives_ranks_are_aligned_on_base_time(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.pt.trace.json", [x_event("a", 1, 1)], rank=0, baseTimeNanoseconds=1_000_000)
    write_trace(tmp_path / "rank1.pt.trace.json", [x_event("a", 1, 1)], rank=1, baseTimeNanoseconds=3_000_000)
    stats = merge_folder(tmp_path, tmp_path / "m.json.gz")
    assert [(a.method, a.shift_us) for a in stats.alignment] == [("base time", 0.0), ("base time", 2000.0)]


def test_real_eight_rank_dlrm_aligns_within_microseconds(tmp_path: Path) -> None:
    stats = merge_folder(shared("external-traces", "param_dlrm_v100_8ranks"), tmp_path / "m.json.gz")
    assert [a.method for a in stats.alignment] == ["collectives"] * 8
    assert all(a.max_residual_us is not None and a.max_residual_us <= 5 for a in stats.alignment)
    # One host, one clock: the true error is the shift itself, and the bound covers it.
    assert all(a.residual_us is not None and abs(a.shift_us) <= a.residual_us < 7 for a in stats.alignment)


def test_repeated_thread_names_are_written_once(tmp_path: Path) -> None:
    meta = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}}
    write_trace(tmp_path / "rank0.pt.trace.json", [meta] * 500 + [x_event("a", 1, 1)], rank=0)
    merge_folder(tmp_path, tmp_path / "m.json.gz")
    assert sum(e.get("name") == "thread_name" for e in load(tmp_path / "m.json.gz")["traceEvents"]) == 1


@pytest.mark.parametrize(
    ("cat", "name", "read_as"),
    [
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", (COMM, True, True)),
        # An Intel GPU's all-reduce over oneCCL (torch-xpu-ops#5384 quotes its kernel's name from a Max 1550's trace).
        ("kernel", "oneccl_reduce_base<float, 2, 16, 1, 1, 2>", (COMM, True, True)),
        ("user_annotation", "xccl:all_reduce", (COMM, False, False)),
        ("xpu_runtime", "urEnqueueUSMMemcpy", (COMM, False, False)),
        ("xpu_driver", "zeCommandListAppendMemoryCopy", (COMM, False, False)),
        ("xpu_runtime", "urEnqueueKernelLaunch", (SPAN, False, False)),
        # DTensor's and compiled graphs' functional collectives: the host only issues and waits, its end drifts.
        ("cpu_op", "_c10d_functional::all_reduce", (COMM, False, False)),
        ("cpu_op", "_c10d_functional::wait_tensor", (COMM, False, False)),
    ],
)
def test_collectives_and_copies_of_every_device_s_library_are_kept_first_and_kernels_that_end_together_align_clocks(
    cat, name, read_as
):
    assert classify("X", cat, name) == read_as
