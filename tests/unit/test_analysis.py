"""Analysis on this project's CPU recordings (tests/data/traces, see make_traces.py) and on
small hand-written CPU traces. GPU semantics are tested on real GPU traces in test_analysis_real.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.cross import busy_time_stragglers
from orchestrator.analysis.findings import find_all
from orchestrator.models.analysis import RankSummary, Straggler, Summary
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.realtraces import external
from tests.support.tracefiles import TRACES, case


def codes(summary: Summary) -> list[str]:
    return [f.code for f in summary.findings]


# ---- real CPU traces --------------------------------------------------------


def test_healthy_job_has_no_findings() -> None:
    summary = analyze_folder(case("healthy"))
    assert [r.rank for r in summary.ranks] == [0, 1]
    assert summary.findings == []
    assert summary.stragglers == []


def test_step_numbers_are_the_global_steps_on_every_rank() -> None:
    summary = analyze_folder(case("healthy"))
    assert summary.steps == [121, 122, 123, 124]
    assert all([s.step for s in r.steps] == summary.steps for r in summary.ranks)
    assert summary.world_size == 2


def test_phases_add_up_to_step_time() -> None:
    summary = analyze_folder(case("straggler"))
    for rank in summary.ranks:
        for step in rank.steps:
            assert step.phases.total() == pytest.approx(step.duration_ms, rel=1e-6)


def test_dataloader_bound_job_is_named() -> None:
    summary = analyze_folder(case("dataloader_bound"))
    (finding,) = summary.findings
    assert finding.code == "dataloader_bound"
    assert finding.ranks == [0, 1]
    assert "num_workers=0" in finding.evidence
    # A CPU-only job has no copy to a device that pinned memory would speed up: it is not told to pin.
    assert "num_workers" in finding.fix and "pin_memory" not in finding.fix
    # 8 items x 6 ms of sleep per step.
    assert all(r.mean_phases.data > 45 for r in summary.ranks)


def test_straggler_rank_and_phase_are_named() -> None:
    summary = analyze_folder(case("straggler"))
    (straggler,) = summary.stragglers
    assert straggler.rank == 1
    assert straggler.phase == "forward"
    assert straggler.excess_ms > 40  # it sleeps 50 ms per forward
    assert codes(summary) == ["straggler"]
    assert "Rank 1" in summary.findings[0].evidence and "forward" in summary.findings[0].evidence


def test_straggler_waits_least_in_collectives() -> None:
    summary = analyze_folder(case("straggler"))
    fast, slow = summary.ranks
    # Synchronous allreduce: the fast rank waits for the slow one.
    assert fast.comm_wait_ms > 40
    assert slow.comm_wait_ms < fast.comm_wait_ms / 5


def test_loss_item_every_step_is_reported_as_cpu_info() -> None:
    summary = analyze_folder(case("loss_item"))
    (finding,) = summary.findings
    assert finding.code == "host_sync"
    # On a CPU-only trace item() is cheap; the finding says so instead of warning.
    assert finding.severity == "info"
    assert "aten::item" in finding.evidence and "CPU-only" in finding.evidence
    assert all(s.sync_calls == 1 for r in summary.ranks for s in r.steps)


def test_straggler_impl_is_swappable() -> None:
    def everyone(ranks: list[RankSummary]) -> list[Straggler]:
        return [
            Straggler(
                rank=r.rank,
                excess_ms=1,
                excess_fraction=0.1,
                phase="data",
                phase_excess_ms=1,
                comm_wait_ms=0,
                reference_comm_wait_ms=0,
            )
            for r in ranks
        ]

    assert [s.rank for s in analyze_folder(case("healthy"), straggler_impl=everyone).stragglers] == [0, 1]
    assert analyze_folder(case("straggler"), straggler_impl=busy_time_stragglers).stragglers[0].rank == 1


def _stretch(rank: RankSummary, ms: float, steps: int, phase: str = "forward") -> RankSummary:
    """``rank`` with its first ``steps`` steps ``ms`` longer in ``phase``, means updated to match."""

    def longer(s):
        return s.model_copy(
            update={
                "duration_ms": s.duration_ms + ms,
                "phases": s.phases.model_copy(update={phase: s.phases.get(phase) + ms}),
            }
        )

    extra = ms * steps / len(rank.steps)
    return rank.model_copy(
        update={
            "steps": [longer(s) if i < steps else s for i, s in enumerate(rank.steps)],
            "mean_step_ms": rank.mean_step_ms + extra,
            "mean_phases": rank.mean_phases.model_copy(update={phase: rank.mean_phases.get(phase) + extra}),
            "comm_wait_ms": rank.comm_wait_ms + (extra if phase == "comm" else 0.0),
        }
    )


def _straggle(slow: RankSummary, fast: RankSummary, ms: float, steps: int) -> list[RankSummary]:
    """``slow`` computes ``ms`` longer on its first ``steps`` steps, and ``fast`` waits for it."""
    return [_stretch(slow, ms, steps), _stretch(fast, ms, steps, phase="comm")]


def test_one_slow_step_does_not_make_a_straggler() -> None:
    rank0, rank1 = analyze_folder(case("healthy")).ranks
    assert len(rank0.steps) >= 3

    assert busy_time_stragglers(_straggle(rank0, rank1, 3 * rank0.mean_step_ms, steps=1)) == []


def test_a_rank_slower_on_most_steps_is_a_straggler() -> None:
    rank0, rank1 = analyze_folder(case("healthy")).ranks

    (straggler,) = busy_time_stragglers(_straggle(rank0, rank1, rank0.mean_step_ms, steps=len(rank0.steps) - 1))
    assert straggler.rank == 0
    assert straggler.phase == "forward"


def test_a_straggler_slow_outside_the_model_is_told_its_work_between_steps() -> None:
    # Rank 0 alone logs or writes every step (its 'other' phase) while rank 1 waits for it in the all-reduce.
    rank0, rank1 = analyze_folder(case("healthy")).ranks
    ranks = [_stretch(rank0, rank0.mean_step_ms, len(rank0.steps), phase="other"), _stretch(rank1, rank0.mean_step_ms, len(rank1.steps), phase="comm")]
    (finding,) = [f for f in find_all(ranks, busy_time_stragglers(ranks)) if f.code == "straggler"]
    assert finding.title == "Rank 0 is a straggler (other)"
    assert finding.fix.startswith("Find what differs on that rank: it does more outside the model: rank-gated work between steps")


def test_extra_busy_time_nobody_waited_for_is_not_a_straggler() -> None:
    # Step boundaries jitter on a shared host: one rank's steps look longer, but the other never waited.
    rank0, rank1 = analyze_folder(case("healthy")).ranks

    assert busy_time_stragglers([_stretch(rank0, rank0.mean_step_ms, steps=len(rank0.steps)), rank1]) == []


def test_summary_fits_the_manifest() -> None:
    summary = analyze_folder(case("straggler"))
    manifest = Manifest(
        profile_id="p1",
        target="job",
        status=ProfileState.DONE,
        request=ProfileRequest(target="job", steps=4),
        storage_uri="file:///tmp/p1",
        start_step=121,
        stop_step=125,
        ranks=[RankResult(rank=0, state=RankState.DONE)],
        requested_at=utcnow(),
        finished_at=utcnow(),
        summary=summary.model_dump(mode="json"),
    )
    again = Manifest.model_validate_json(manifest.model_dump_json())
    assert Summary.model_validate(again.summary) == summary


# ---- loader edge cases ------------------------------------------------------


def test_duplicate_rank_is_rejected_with_reason() -> None:
    summary = analyze_folder(case("duplicate_rank"))
    assert [r.rank for r in summary.ranks] == [0]
    assert {r.path.name for r in summary.rejected} == {"worker-b.pt.trace.json.gz", "worker-c.pt.trace.json.gz"}
    assert all(r.rank == 1 and "duplicate rank 1" in r.reason for r in summary.rejected)
    assert any("rank(s) [1]" in i for i in summary.issues)


def test_unparseable_files_are_rejected_and_the_rest_analyzed() -> None:
    summary = analyze_folder(case("unparseable"))
    assert [r.rank for r in summary.ranks] == [0]
    assert len(summary.ranks[0].steps) == 4
    reasons = {r.path.name: r.reason for r in summary.rejected}
    assert "Compressed file ended" in reasons["rank1.pt.trace.json.gz"]
    assert "expected '{'" in reasons["rank2.pt.trace.json"]


def test_a_trace_that_names_no_rank_takes_the_next_free_rank_and_says_so() -> None:
    summary = analyze_folder(case("no_distributed_info"))
    assert [(r.rank, r.file) for r in summary.ranks] == [(0, "rank0.pt.trace.json.gz"), (1, "trainer.pt.trace.json.gz")]
    assert summary.rejected == []
    assert "trainer.pt.trace.json.gz names no rank: taken as rank 1 by file name order" in summary.issues


def test_rank_in_name_contradicting_distributed_info_is_rejected(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank3.pt.trace.json", rank=0, events=[step(5, 0, 1000)])
    summary = analyze_folder(tmp_path)
    assert summary.ranks == []
    assert "file name says rank 3 but distributedInfo says rank 0" in summary.rejected[0].reason


def test_missing_folder_raises() -> None:
    with pytest.raises(FileNotFoundError):
        analyze_folder(TRACES / "no-such-case")


# ---- hand-written CPU traces and one real GPU rank -----------------------------

MAIN = {"pid": 100, "tid": 1}
MS = 1000.0


def span(
    name: str, start_ms: float, end_ms: float, cat: str = "cpu_op", where: dict[str, Any] = MAIN, **args: Any
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        **where,
        "ts": start_ms * MS,
        "dur": (end_ms - start_ms) * MS,
        "args": args,
    }


def step(n: int, start_ms: float, end_ms: float) -> dict[str, Any]:
    return span(f"ProfilerStep#{n}", start_ms, end_ms, cat="user_annotation")


def write_trace(path: Path, *, rank: int, events: list[dict[str, Any]], world_size: int = 2, **top: Any) -> Path:
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        **top,
        "traceEvents": events,
    }
    with gzip.open(path, "wt") if path.suffix == ".gz" else open(path, "w") as f:
        json.dump(doc, f)
    return path


def test_memory_peak_reads_the_device_capacity_and_warns_near_it() -> None:
    # HTA's df_index_resolver trace: 6.17 GiB allocated at most on a 31.7 GiB V100, no risk.
    summary = external("hta_df_index_resolver_v100_r1of2")
    rank = summary.ranks[0]
    peak = next(m for m in rank.memory if m.device == "cuda:1")
    assert peak.capacity_bytes == 34089730048 and peak.peak_bytes == pytest.approx(6.17 * 1024**3, rel=1e-3)
    assert "memory_peak" not in codes(summary)
    # The same rank with its peak at 95% of the device.
    full = rank.model_copy(update={"memory": [peak.model_copy(update={"peak_bytes": int(0.95 * peak.capacity_bytes)})]})
    (found,) = [f for f in find_all([full], []) if f.code == "memory_peak"]
    assert (found.code, found.severity, found.title) == ("memory_peak", "warning", "Memory peaks at 95% of cuda:1")
    # That V100 has no bf16 tensor cores: the mixed precision told is fp16's, with its scaler.
    assert "fp16 autocast with a GradScaler" in found.fix and "bf16" not in found.fix


def comm_bound_events(rank: int) -> list[dict[str, Any]]:
    """CPU DDP-like step where the main thread idles 50 ms while gloo reduces on its own thread."""
    gloo = {"pid": 100, "tid": 2}
    return [
        step(7, 0, 100),
        span("aten::conv2d", 0, 20),
        span("autograd::engine::evaluate_function: ConvolutionBackward0", 20, 40),
        span("c10d::allreduce_", 39, 40),
        span("gloo:all_reduce", 40, 90, cat="user_annotation", where=gloo),
        span("Optimizer.step#SGD.step", 90, 95, cat="user_annotation"),
    ]


def test_comm_not_overlapping_compute_is_named(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_trace(tmp_path / f"rank{rank}.pt.trace.json", rank=rank, events=comm_bound_events(rank))
    summary = analyze_folder(tmp_path)
    # 1 ms launching the allreduce (rule 3 beats backward) + 50 ms idle while gloo reduces.
    assert [round(r.comm_wait_ms, 6) for r in summary.ranks] == [51, 51]
    # Equal waits on every rank: no straggler to blame, the collective itself is exposed.
    assert codes(summary) == ["comm_exposed"]
    assert "51.0 ms (51%)" in summary.findings[0].evidence
