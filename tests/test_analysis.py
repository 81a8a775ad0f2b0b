"""Analysis on real recorded traces (tests/data/traces, see make_traces.py) and on
tiny *synthetic* hand-written traces for what needs a GPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.cross import busy_time_stragglers
from orchestrator.analysis.models import PHASES, RankSummary, Straggler, Summary
from orchestrator.models import Manifest, ProfileRequest, ProfileState, RankResult, RankState, utcnow
from tests.tracefiles import TRACES, case


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
    assert "num_workers" in finding.fix and "pin_memory" in finding.fix
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


# ---- synthetic traces (hand-written: no GPU here) ---------------------------

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


def gpu_step_events() -> list[dict[str, Any]]:
    """A 100 ms synthetic GPU step: 10 ms forward, 20 ms pageable H2D copy, 20 ms backward,
    40 ms cudaStreamSynchronize under loss.item(), 5 ms optimizer, 5 ms other; 14 ms of kernels."""
    stream = {"pid": 0, "tid": 7}
    return [
        step(5, 0, 100),
        span("aten::linear", 0, 10),
        span("aten::to", 10, 30),
        span("aten::_to_copy", 10.1, 29.9),
        span("aten::copy_", 10.2, 29.8),
        span("cudaMemcpyAsync", 10.3, 29.7, cat="cuda_runtime", correlation=1),
        span(
            "Memcpy HtoD (Pageable -> Device)", 10.5, 29.5, cat="gpu_memcpy", where=stream, correlation=1, bytes=1 << 26
        ),
        span("autograd::engine::evaluate_function: AddmmBackward0", 30, 50),
        span("sm90_xmma_gemm", 31, 45, cat="kernel", where=stream, correlation=2),
        span("aten::item", 50, 90),
        span("aten::_local_scalar_dense", 50.1, 89.9),
        span("cudaStreamSynchronize", 50.5, 89.5, cat="cuda_runtime"),
        span("Optimizer.step#AdamW.step", 90, 95, cat="user_annotation"),
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            **MAIN,
            "ts": 40 * MS,
            "args": {"Total Allocated": 76 * 1024**3, "Device Type": 1, "Device Id": 0},
        },
    ]


@pytest.fixture
def gpu_summary(tmp_path: Path) -> Summary:
    props = [{"id": 0, "name": "synthetic GPU", "totalGlobalMem": 80 * 1024**3}]
    write_trace(
        tmp_path / "rank0.pt.trace.json.gz", rank=0, world_size=1, events=gpu_step_events(), deviceProperties=props
    )
    return analyze_folder(tmp_path)


def test_synthetic_gpu_phases_follow_the_documented_rules(gpu_summary: Summary) -> None:
    phases = gpu_summary.ranks[0].steps[0].phases
    expected = {
        "forward": 10,
        "memcpy": 20,
        "backward": 20,
        "sync": 40,
        "optimizer": 5,
        "other": 5,
        "data": 0,
        "comm": 0,
    }
    assert {p: round(phases.get(p), 6) for p in PHASES} == expected


def test_synthetic_gpu_sync_every_step_is_a_warning(gpu_summary: Summary) -> None:
    finding = next(f for f in gpu_summary.findings if f.code == "host_sync")
    assert finding.severity == "warning"
    assert "aten::item" in finding.evidence and "40.00 ms (40.0%)" in finding.evidence


def test_synthetic_pageable_htod_copies_are_named(gpu_summary: Summary) -> None:
    finding = next(f for f in gpu_summary.findings if f.code == "htod_copy")
    assert "1 of 1 host-to-device copies per step read pageable" in finding.evidence
    assert "pin_memory=True" in finding.fix and "non_blocking=True" in finding.fix


def test_synthetic_low_gpu_utilization_is_named(gpu_summary: Summary) -> None:
    gpu = gpu_summary.ranks[0].gpu
    assert gpu is not None and gpu.utilization == pytest.approx(0.33)  # 14 ms kernel + 19 ms copy of 100 ms
    finding = next(f for f in gpu_summary.findings if f.code == "low_gpu_utilization")
    assert "sync" in finding.evidence  # the host phase keeping the GPU idle
    assert gpu_summary.ranks[0].top_kernels[0].name == "sm90_xmma_gemm"


def test_synthetic_memory_peak_near_capacity_is_named(gpu_summary: Summary) -> None:
    (peak,) = gpu_summary.ranks[0].memory
    assert (peak.device, peak.peak_bytes, peak.capacity_bytes) == ("cuda:0", 76 * 1024**3, 80 * 1024**3)
    finding = next(f for f in gpu_summary.findings if f.code == "memory_peak")
    assert "95%" in finding.title


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
