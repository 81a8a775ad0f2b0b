"""The agent calls ``prof.step()`` from an optimizer step post-hook, which torch runs inside the
``Optimizer.step#...`` annotation: every trace rayprof records starts the next ``ProfilerStep`` a few µs before
that annotation ends. The next step's reads and copies are not the optimizer's: a Hugging Face ``Trainer`` job's
report named its nan/inf checks "Optimizer.step#AdamW.step / aten::is_nonzero"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import RankSummary
from tests.support.tracefiles import write_trace, x_event

OPT = "Optimizer.step#SGD.step"


def steps(*more: dict[str, Any]) -> list[dict[str, Any]]:
    """Two steps; the second starts 5 µs before the first's optimizer step ends, as the agent's hook makes it."""
    return [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("aten::linear", 10, 500),
        x_event(OPT, 800, 205, cat="user_annotation"),
        x_event("aten::add_", 810, 100),
        x_event("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
        x_event("aten::linear", 1010, 500),
        *more,
    ]


def only_rank(tmp_path: Path, events: list[dict[str, Any]]) -> RankSummary:
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    return rank


def test_a_read_in_the_next_step_is_not_named_as_the_optimizers(tmp_path: Path) -> None:
    rank = only_rank(tmp_path, steps(x_event("aten::is_nonzero", 1600, 20), x_event("aten::item", 1605, 10)))
    assert [s.name for s in rank.sync_ops] == ["aten::is_nonzero"]


def test_a_copy_in_the_next_step_is_not_issued_by_the_optimizer(tmp_path: Path) -> None:
    upload = [
        x_event("aten::to", 1600, 100),
        x_event("aten::copy_", 1605, 90),
        x_event("cudaMemcpyAsync", 1610, 80, cat="cuda_runtime", correlation=7),
        x_event("Memcpy HtoD (Pageable -> Device)", 1620, 60, cat="gpu_memcpy", pid=0, tid=7, correlation=7, stream=7),
        x_event("void gemm", 1100, 300, cat="kernel", pid=0, tid=7, correlation=8, stream=7),
    ]
    rank = only_rank(tmp_path, steps(*upload))
    (htod,) = [c for c in rank.copies if c.direction == "HtoD"]
    assert [op.name for op in htod.issued_by] == ["aten::to"]
