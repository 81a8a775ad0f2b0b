"""Idle time in the optimizer step is told the change that exists for the optimizer the trace shows: fused=True
for torch's foreach Adam, foreach=True for a per-parameter RMSprop, torch.compile for an optimizer torch.optim does not
ship, and never AdamW(fused=True) to a job that runs Shampoo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Finding
from tests.support.realtraces import external, h100
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch


def _optimizer_idle(tmp_path: Path, optimizer: str, ops: list[str], before: list[dict[str, Any]] | None = None) -> Finding:
    """The utilization finding of a 1 ms step whose device idles 0.4 ms while ``optimizer`` runs ``ops``."""
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        launch(0, 1), kernel(0, 300, 1),
        *(before or []),
        x_event(f"Optimizer.step#{optimizer}.step", 300, 400, cat="user_annotation"),
        *(x_event(op, 310 + 90 * i, 80) for i, op in enumerate(ops)),
        launch(700, 2), kernel(710, 290, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    summary = analyze_folder(tmp_path)
    return next(f for f in summary.findings if f.code == "low_gpu_utilization")


def test_torchs_foreach_adam_on_an_h100_is_told_fused_true_for_adam() -> None:
    # The H100 recording after its DataLoader fix: Adam runs its default foreach ops (aten::_foreach_*) on the GPU.
    # Before: "use a fused or foreach optimizer (e.g. torch.optim.AdamW(params, fused=True), or foreach=True)".
    (rank,) = h100("seed003_after").ranks
    assert rank.optimizer_impl == "foreach"
    fix = h100("seed003_after").findings[0].fix
    assert fix.startswith(
        "The optimizer's host time leaves the device idle 1.4 ms per step (Adam): pass fused=True to Adam "
        "(torch.optim.Adam(params, fused=True)): one kernel launch per parameter group in place of its foreach ops"
    )
    assert "AdamW" not in fix and "foreach=True" not in fix


def test_an_optimizer_torch_does_not_ship_is_not_told_fused_true() -> None:
    # HTA's 128-rank trace: Shampoo and an EMA wrapper (foreach adds) leave the device idle 39 ms a step.
    fix = external("hta_trace_filter_2of128").findings[0].fix
    assert (
        "(Shampoo and EMAOptimizer): Shampoo.step and EMAOptimizer.step are not torch.optim's, so fused=True does not "
        "exist for them: torch.compile the step" in fix
    )
    assert "pass fused=True" not in fix and "AdamW(params, fused=True)" not in fix


def test_a_per_parameter_rmsprop_is_told_foreach(tmp_path: Path) -> None:
    fix = _optimizer_idle(tmp_path, "RMSprop", ["aten::mul_", "aten::addcmul_", "aten::sqrt"]).fix
    assert "(RMSprop): pass foreach=True to RMSprop: a few multi-tensor ops for all parameters" in fix
    assert "fused=True" not in fix


def test_a_per_parameter_sgd_is_told_fused_true_for_its_ops_per_parameter(tmp_path: Path) -> None:
    fix = _optimizer_idle(tmp_path, "SGD", ["aten::add_", "aten::add_"]).fix
    assert "pass fused=True to SGD (torch.optim.SGD(params, fused=True)): one kernel launch per parameter group in place of its ops per parameter" in fix


def test_a_fused_adamw_is_told_what_is_left_not_fused_again(tmp_path: Path) -> None:
    fix = _optimizer_idle(tmp_path, "AdamW", ["aten::_fused_adamw_"]).fix
    assert "(AdamW): the step is fused already: torch.compile it, or make fewer steps" in fix
    assert "pass fused=True" not in fix


def test_a_librarys_fused_adam_is_told_it_is_fused_already_not_that_torch_lacks_it(tmp_path: Path) -> None:
    # HTA's rank_unavailable trace steps DeepSpeed's / Apex's FusedAdam (multi_tensor_apply kernels, no aten::_fused_ op).
    fix = _optimizer_idle(tmp_path, "FusedAdam", ["aten::add_"]).fix
    assert "(FusedAdam): FusedAdam.step is fused already: torch.compile it, or make fewer steps" in fix
    assert "not torch.optim's" not in fix and "pass fused=True" not in fix


@pytest.mark.parametrize(
    ("ops", "impl"),
    [
        (["aten::_foreach_mul_"], "foreach"),
        (["aten::_fused_adam_", "aten::_foreach_add_"], "fused"),
        (["aten::add_"], "per_parameter"),
        (["aten::_fused_dropout", "aten::add_"], "per_parameter"),  # a fused op that is no optimizer's
    ],
)
def test_how_the_step_updates_the_parameters_is_read_from_the_ops_inside_it(tmp_path: Path, ops: list[str], impl: str) -> None:
    _optimizer_idle(tmp_path, "Adam", ops)
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.optimizer_impl == impl


def test_foreach_ops_outside_the_step_do_not_make_it_foreach(tmp_path: Path) -> None:
    # clip_grad_norm_ runs foreach ops before the step: the step itself still updates parameter by parameter.
    _optimizer_idle(tmp_path, "Adam", ["aten::add_"], before=[x_event("aten::_foreach_norm", 250, 40)])
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.optimizer_impl == "per_parameter"


def test_the_optimizer_classes_are_read_from_the_steps_wrapped_ones_included() -> None:
    # TorchRec's CombinedOptimizer steps a dense Adam inside its own step (HTA's MTIA trace).
    (rank,) = external("hta_mtia_single_rank").ranks
    assert rank.optimizers == ["CombinedOptimizer", "Adam"]
    fix = external("hta_mtia_single_rank").findings[0].fix
    assert "(CombinedOptimizer and Adam): pass fused=True to Adam" in fix and "where the device has fused kernels" in fix
