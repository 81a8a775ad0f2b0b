"""A user's region that holds the model's forward is around the step's work, not a part of it a fix can point at
(issue 29): xDiT's ``execute_diffusion_...`` covers 99.97% of its step without enclosing it, every forward pass
inside, and was told "keep the region's work on the device" for 400 ms a step. The ops inside it are the cause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch


def findings(tmp_path: Path, events: list[dict[str, Any]]) -> list[Finding]:
    write_trace(tmp_path / "rank0.pt.trace.json", [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"), *events], world_size=1)
    return analyze_folder(tmp_path).findings


def diffusion_step(*, forward: bool) -> list[dict[str, Any]]:
    """A region from 1 to 999 µs (inside the step, not around it); in it, a host op idles the device 110-610 µs,
    inside a module's forward when ``forward``."""
    events = [
        x_event("execute_diffusion_1_256x256", 1, 998, cat="user_annotation"),
        launch(2, 1), kernel(2, 100, 1),
        x_event("aten::nonzero", 110, 500), launch(600, 3, dur=2), kernel(605, 2, 3),  # its own kernel, launched last
        launch(640, 2), kernel(650, 300, 2),
    ]
    if forward:
        events.append(x_event("nn.Module: SD3Transformer2DModel_0", 5, 990, cat="python_function"))
    return events


def test_a_region_holding_the_models_forward_is_no_cause_the_ops_inside_it_are(tmp_path: Path) -> None:
    top = findings(tmp_path, diffusion_step(forward=True))[0]
    assert top.fix.startswith("The host op aten::nonzero leaves the device idle 0.5 ms per step")
    assert "execute_diffusion" not in top.fix


def test_a_region_without_a_forward_inside_is_still_the_cause_named(tmp_path: Path) -> None:
    # The profiler tutorial's MASK INDICES covers 98.6-99.1% of its steps and is the cause to name.
    top = findings(tmp_path, diffusion_step(forward=False))[0]
    assert top.fix.startswith("The host runs the region 'execute_diffusion_1_256x256' while the device idles")


def test_a_read_inside_a_region_holding_the_forward_names_no_region(tmp_path: Path) -> None:
    events = [
        x_event("execute_diffusion_1_256x256", 1, 998, cat="user_annotation"),
        x_event("nn.Module: SD3Transformer2DModel_0", 5, 500, cat="python_function"),
        x_event("aten::mm", 10, 400),
        x_event("aten::item", 600, 300),
    ]
    sync = next(f for f in findings(tmp_path, events) if f.code == "host_sync")
    assert "execute_diffusion" not in sync.fix and "execute_diffusion" not in sync.evidence
