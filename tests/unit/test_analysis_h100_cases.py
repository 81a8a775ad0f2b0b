"""Issue 29's cases recorded on an H100 (torch 2.11.0+cu130, plain torch.profiler, no rayprof in the job):
tests/data/record_gpu_issue29.py made them. Each asserts the verdict the issue asks for."""

from __future__ import annotations

import functools

import pytest

from orchestrator.analysis import Summary, analyze_folder
from tests.support.realtraces import finding, only_rank
from tests.support.tracefiles import case


@functools.cache
def h100_case(name: str) -> Summary:
    return analyze_folder(case(f"h100_{name}"))


def test_mask_indices_pageable_copies_are_a_cause_named_by_their_region() -> None:
    # The profiler tutorial's module: mask.cpu().numpy(), np.argwhere on the host, the indices copied back. The
    # pageable copies occupy the device 87.7 ms of a 345 ms step; before issue 29 that was "useful" device time
    # and no copy was named ("MASK INDICES" was Python / CPU ops, and the fix was DataLoader workers).
    summary = h100_case("mask_indices")
    rank = only_rank(summary)
    pageable = {c.direction: c for c in rank.copies if c.host_memory == "pageable"}
    assert set(pageable) == {"DtoH", "HtoD"}
    assert all(c.issued_by[0].name == "MASK INDICES / aten::to" for c in pageable.values())
    copies = finding(summary, "htod_copy")
    assert copies.severity == "warning" and copies.max_saving_ms == pytest.approx(88.1, abs=1.0)
    assert "torch.nonzero" in copies.fix and "round trip" in copies.fix and "pin_memory" not in copies.fix
    top = summary.findings[0]
    assert top.code == "low_gpu_utilization" and top.fix.startswith("The region 'MASK INDICES'") and "round trip" in top.fix
    # The .item() and .cpu() waits, and the drain after them, are the sync finding's.
    assert finding(summary, "host_sync").severity == "warning"


def test_empty_cache_every_step_is_told_the_caching_allocator() -> None:
    summary = h100_case("allocator")
    rank = only_rank(summary)
    runtime = rank.idle.get("runtime")
    assert runtime is not None and runtime.ms_per_step == pytest.approx(1.9, abs=0.2)
    assert {o.name for o in runtime.top[:2]} == {"cudaFree", "cudaMalloc"}
    top = summary.findings[0]
    assert top.code == "low_gpu_utilization" and top.fix.startswith("cudaFree, cudaMalloc") and "empty_cache" in top.fix
    assert "DataLoader" not in top.fix


def test_a_closure_optimizers_backward_on_the_gpu_is_backward() -> None:
    # optimizer.step(closure): the autograd engine's device thread runs backward while the main thread waits
    # inside Optimizer.step#Adam.step. Before issue 29: backward 0 ms, all of it optimizer time.
    summary = h100_case("closure")
    p = only_rank(summary).mean_phases
    assert p.backward > 0.8 and p.forward > 0.8 and p.optimizer < p.backward
    # The optimizer's host time named in the advice is its own, not the closure's model.
    top = summary.findings[0]
    assert "the optimizer step 0.7 ms" in top.evidence
