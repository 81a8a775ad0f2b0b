"""Per-rank postprocessing fanned out: order, bounded concurrency, progress, cancel; stats into the manifest."""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from actors.controller.profiles.ray_rank_map import PostprocessCancelled, RayRankMap
from orchestrator.analysis import analyze_for_merge, analyze_traces
from orchestrator.analysis.postprocess import postprocess
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest, PostprocessProgress, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.storage import open_storage
from orchestrator.traces.discover import TraceFile, TraceSet, discover_traces
from orchestrator.traces.fanout import process_pool, serial
from orchestrator.traces.merge import merge_traces
from tests.support.tracefiles import case, write_trace, x_event


def _double(tf: TraceFile, arg: int) -> tuple[int, int]:
    return tf.rank, 2 * arg


class _FakeCluster:
    """Tasks that finish in the order the test says; records how many ran at once."""

    def __init__(self, finish_order: list[int]) -> None:
        self.finish_order = finish_order
        self.results: dict[int, Any] = {}
        self.running: set[int] = set()
        self.most_at_once = 0
        self.killed: list[int] = []
        self.nodes: dict[int, str | None] = {}

    def submit(self, fn: Any, tf: TraceFile, arg: Any, node_id: str | None) -> int:
        self.nodes[tf.rank] = node_id
        self.results[tf.rank] = fn(tf, arg)
        self.running.add(tf.rank)
        self.most_at_once = max(self.most_at_once, len(self.running))
        return tf.rank

    def wait(self, refs: list[int], timeout: float) -> list[int]:
        ready = [r for r in self.finish_order if r in refs][:1]
        if ready:
            self.finish_order.remove(ready[0])
            self.running.discard(ready[0])
        return ready

    def get(self, ref: int) -> Any:
        return self.results.pop(ref)

    def kill(self, ref: int) -> None:
        self.killed.append(ref)


def _items(n: int) -> list[tuple[TraceFile, Any]]:
    return [(TraceFile(rank=r, path=Path(f"rank{r}.json")), r) for r in range(n)]


def test_ray_map_yields_in_rank_order_with_bounded_tasks_and_progress() -> None:
    cluster = _FakeCluster(finish_order=[2, 0, 3, 1, 5, 4])
    seen: list[PostprocessProgress] = []
    fan = RayRankMap(seen.append, in_flight=3, submit=cluster.submit, wait=cluster.wait, get=cluster.get, kill=cluster.kill)
    assert list(fan(_double, _items(6), "analysing")) == [(r, 2 * r) for r in range(6)]
    assert cluster.most_at_once == 3
    assert [str(p) for p in seen] == [f"analysing {d}/6 ranks" for d in range(7)]
    assert cluster.killed == []


def test_ray_map_cancel_stops_and_kills_the_running_tasks() -> None:
    cluster = _FakeCluster(finish_order=[0])
    fan = RayRankMap(lambda p: None, in_flight=2, submit=cluster.submit, wait=cluster.wait, get=cluster.get, kill=cluster.kill)
    results = fan(_double, _items(4), "merging")
    assert next(results) == (0, 0)
    fan.cancel()
    with pytest.raises(PostprocessCancelled, match="merging 1/4"):
        next(results)
    assert cluster.killed == [1]  # the one running; ranks 2 and 3 were never started


def test_ray_map_runs_each_ranks_task_on_that_ranks_node() -> None:
    """The node of a rank that finished the window answered moments ago; any other node may have
    dropped off the network (tests/live/test_netns.py). A rank with no node known goes anywhere (None)."""
    cluster = _FakeCluster(finish_order=[0, 1, 2])
    fan = RayRankMap(
        lambda p: None,
        in_flight=3,
        nodes={0: "node-a", 1: "node-b"},
        submit=cluster.submit,
        wait=cluster.wait,
        get=cluster.get,
        kill=cluster.kill,
    )
    assert list(fan(_double, _items(3), "analysing")) == [(0, 0), (1, 2), (2, 4)]
    assert cluster.nodes == {0: "node-a", 1: "node-b", 2: None}


@pytest.mark.parametrize("other_thread", [False, True], ids=["as called", "with another thread running"])
def test_process_pool_returns_serial_results_in_order_from_any_caller(other_thread: bool) -> None:
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    if other_thread:
        helper.start()
    try:
        with process_pool(2) as rank_map:
            pooled = list(rank_map(_double, _items(5), "test"))
    finally:
        stop.set()
    assert pooled == list(serial(_double, _items(5)))


def _started(tf: TraceFile, arg: Any) -> tuple[int, int]:
    return tf.rank, time.monotonic_ns()


def test_process_pool_hands_out_the_largest_file_first_and_answers_in_the_order_given(tmp_path: Path) -> None:
    items = []
    for rank, size in ((0, 10), (1, 3000), (2, 200)):
        path = tmp_path / f"rank{rank}.pt.trace.json"
        path.write_bytes(b" " * size)
        items.append((TraceFile(rank=rank, path=path), None))
    with process_pool(1) as rank_map:  # one worker runs them one at a time, in the order handed out
        results = list(rank_map(_started, items, "test"))
    assert [rank for rank, _ in results] == [0, 1, 2]
    assert [rank for rank, _ in sorted(results, key=lambda r: r[1])] == [1, 2, 0]


def _decompress_one_member(path: Path) -> bytes:
    d = zlib.decompressobj(31)
    data = d.decompress(path.read_bytes())
    assert d.eof and d.unused_data == b""  # one gzip member: viewers that read only the first see everything
    return data


def test_parallel_merge_writes_the_same_trace_as_serial(tmp_path: Path) -> None:
    traces = discover_traces(case("straggler"))
    serial_stats = merge_traces(traces, tmp_path / "serial.json.gz", max_bytes=20_000)
    with process_pool(2) as rank_map:
        pooled_stats = merge_traces(traces, tmp_path / "pooled.json.gz", max_bytes=20_000, rank_map=rank_map)
    one, two = _decompress_one_member(tmp_path / "serial.json.gz"), _decompress_one_member(tmp_path / "pooled.json.gz")
    assert one == two and json.loads(one)["traceEvents"]
    assert serial_stats.model_dump(exclude={"seconds"}) == pooled_stats.model_dump(exclude={"seconds"})
    assert serial_stats.dropped is not None and serial_stats.output_raw_bytes <= 20_000


def _draft(tmp_path: Path, spec: StorageSpec, prefix: str) -> Manifest:
    storage = open_storage(spec)
    ranks = []
    for rank in (0, 1):
        events = [x_event("ProfilerStep#1", 0, 1000), x_event("aten::mm", 10 + rank, 500 - 100 * rank)]
        events += [x_event("ncclKernel_AllReduce", 600 + 7 * rank + 50 * k, 40, cat="kernel", pid=0, tid=7) for k in range(3)]
        local = write_trace(tmp_path / f"rank{rank}.pt.trace.json.gz", events, rank=rank, baseTimeNanoseconds=10**12 + rank * 10**6)
        art = storage.scoped(prefix).put_file(local, f"traces/{local.name}", "trace")
        ranks.append(RankResult(rank=rank, host=f"h{rank}", state=RankState.DONE, base_time_ns=10**12 + rank * 10**6, artifacts=[art]))
    return Manifest(
        profile_id="p1", target="job", status=ProfileState.DONE, request=ProfileRequest(target="job", steps=1),
        storage_uri=storage.uri(prefix), start_step=1, stop_step=2, ranks=ranks, requested_at=utcnow(),
        finished_at=utcnow(), cluster={"world_size": 2},
    )


def test_postprocess_carries_budget_drops_and_alignment_into_the_manifest(tmp_path: Path) -> None:
    spec = StorageSpec(uri=(tmp_path / "store").as_uri())
    prefix = "job/p1"
    draft = _draft(tmp_path, spec, prefix)
    result = postprocess(spec, prefix, draft, max_bytes=40_000, rank_map=serial)
    manifest = Manifest.model_validate_json(draft.model_copy(update={"merge": result.merge}).model_dump_json())
    merge = manifest.merge
    assert merge is not None and merge.max_bytes == 40_000 and merge.ranks == [0, 1]
    assert [(a.rank, a.method, a.matched) for a in merge.alignment] == [(0, "collectives", 0), (1, "collectives", 3)]
    # The base times (from the manifest) say rank 1 is 1 ms later; its collectives, which end together,
    # say its own clock reads 7 µs late: the collectives win, and nothing is left over.
    assert merge.alignment[1].shift_us == pytest.approx(-7)
    assert merge.alignment[1].max_residual_us == pytest.approx(0) and merge.alignment[1].residual_us == pytest.approx(1)
    assert result.summary.world_size == 2 and len(result.summary.ranks) == 2
    merged = open_storage(spec).get_bytes(f"{prefix}/merged.trace.json.gz")
    meta = json.loads(gzip.decompress(merged))["rayprof"]
    assert meta["max_bytes"] == 40_000 and [a["rank"] for a in meta["alignment"]] == [0, 1]


def test_a_postprocess_past_its_timeout_leaves_no_unlisted_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading

    from actors.controller.profiles import postprocess_job as controller_post
    from actors.controller.profiles.state import Profile

    spec = StorageSpec(uri=(tmp_path / "store").as_uri())
    draft = _draft(tmp_path, spec, "job/p1")
    profile = Profile(id="p1", request=draft.request, storage=spec, storage_uri=draft.storage_uri)
    uploaded = threading.Event()

    def slow_postprocess(spec: StorageSpec, prefix: str, draft: Manifest, **_: Any) -> None:
        open_storage(spec).scoped(prefix).put_bytes(b"{}", "merged.trace.json.gz", "merged_trace")
        uploaded.set()
        threading.Event().wait(1.0)  # still joining when the timeout comes

    monkeypatch.setattr(controller_post, "postprocess", slow_postprocess)
    monkeypatch.setattr(controller_post, "_CANCEL_GRACE_S", 0.05)
    manifest = asyncio.run(controller_post.postprocess_in_task(draft, profile, timeout_s=0.3))
    assert uploaded.is_set() and "ran past its 0.3s timeout" in (manifest.analysis_error or "")
    assert not open_storage(spec).exists(f"{profile.prefix}/merged.trace.json.gz")
    assert manifest.merge is None and profile.postprocess is None


def _merged_and_summary(traces: TraceSet, out: Path, one_read: bool) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    if one_read:
        summary, scans = analyze_for_merge(traces)
        stats = merge_traces(traces, out, max_bytes=20_000, scans=scans)
    else:
        summary, stats = analyze_traces(traces), merge_traces(traces, out, max_bytes=20_000)
    return _decompress_one_member(out), summary.model_dump(), stats.model_dump(exclude={"seconds"})


@pytest.mark.parametrize("name", ["straggler", "unparseable"])
def test_one_read_per_rank_for_analysis_and_merge_changes_nothing(tmp_path: Path, name: str) -> None:
    traces = discover_traces(case(name))
    apart = _merged_and_summary(traces, tmp_path / "apart.json.gz", one_read=False)
    together = _merged_and_summary(traces, tmp_path / "together.json.gz", one_read=True)
    assert apart == together and apart[1]["ranks"]


def test_a_rank_the_analysis_refuses_is_scanned_by_the_merge_itself(tmp_path: Path) -> None:
    good = [x_event("ProfilerStep#1", 0, 100, cat="user_annotation"), x_event("aten::mm", 10, 50)]
    write_trace(tmp_path / "rank0.pt.trace.json", good, rank=0)
    # Valid JSON the merge carries, but args of the wrong shape for the analysis.
    write_trace(tmp_path / "rank1.pt.trace.json", [*good, {**x_event("aten::add", 20, 5), "args": [1, 2]}], rank=1)
    traces = discover_traces(tmp_path)
    summary, scans = analyze_for_merge(traces)
    assert [r.rank for r in summary.ranks] == [0] and [r.rank for r in summary.rejected] == [1]
    assert sorted(scans) == [0]
    stats = merge_traces(traces, tmp_path / "m.json.gz", scans=scans)
    assert stats.ranks == [0, 1] and stats.truncated == [] and stats.events == 5


def test_a_rank_whose_file_is_gone_is_refused_by_the_one_read_not_raised(tmp_path: Path) -> None:
    traces = discover_traces(case("straggler"))
    gone = traces.files[0].model_copy(update={"path": tmp_path / "gone.pt.trace.json.gz"})
    summary, scans = analyze_for_merge(traces.model_copy(update={"files": [gone, *traces.files[1:]]}))
    assert [r.rank for r in summary.rejected] == [gone.rank] and gone.rank not in scans
