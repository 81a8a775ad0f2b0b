"""Advice on the model's own ops (issue 29 item 4): the host's time in them is one cause, weighed by its largest op,
told with the fix that cuts it (torch.compile, CUDA graphs for a compiled model, a larger batch) once, beside launch
pace; split from test_analysis_advice.py, which holds the other causes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Finding
from tests.support.realtraces import external, finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch


def ten_ms_step(tmp_path: Path, host: list[dict[str, Any]], gap_end: float) -> list[Finding]:
    """A 10 ms step: a kernel to 1 ms, the ``host`` spans while the device idles, a kernel from ``gap_end`` on."""
    events = [
        x_event("ProfilerStep#1", 0, 10_000, cat="user_annotation"),
        launch(0, 1), kernel(0, 1000, 1), *host,
        launch(gap_end, 2), kernel(gap_end + 5, 10_000 - gap_end - 5, 2),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path).findings


def small_ops(names: list[str], start: float, each: float) -> list[dict[str, Any]]:
    return [x_event(name, start + i * each, each) for i, name in enumerate(names)]


def test_the_models_ops_are_one_cause_told_before_a_smaller_optimizer_step(tmp_path: Path) -> None:
    # TensorBoard's 2020 ResNet-50 sample (num_workers=4, device busy 62%): the device idles 40.1 ms a step while the
    # host is in the model's own ops (cudnn_convolution 7.8 ms, empty 7.1 ms, ...), 17.0 ms in SGD's step. Before:
    # each op was a cause of its own, so the optimizer's fix alone was told for a bound of 69 ms.
    ops = small_ops(["aten::empty", "aten::cudnn_convolution", "aten::view", "aten::as_strided", "aten::relu"], 1000, 400)
    optimizer = [x_event("Optimizer.step#SGD.step", 3000, 1500, cat="user_annotation"), x_event("aten::add_", 3010, 1480)]
    low = ten_ms_step(tmp_path, [*ops, *optimizer], gap_end=4500)[0]
    assert low.fix.startswith("The host's own time in the model's ops (aten::") and "leaves the device idle 2.0 ms per step" in low.fix
    assert "torch.compile the model" in low.fix and "fused=True" in low.fix


def test_an_op_inside_the_optimizer_step_is_the_optimizers_alone(tmp_path: Path) -> None:
    # HTA's MTIA trace: aten::_copy_from idles the device 1.7 s a step inside the optimizer's step; before, it was
    # told as a host op of its own beside the optimizer's 2.8 s, which already holds it.
    ops = small_ops(["aten::empty", "aten::relu"], 1000, 400)
    optimizer = [x_event("Optimizer.step#SGD.step", 1800, 2700, cat="user_annotation"), x_event("aten::_copy_from", 1810, 2680)]
    low = ten_ms_step(tmp_path, [*ops, *optimizer], gap_end=4500)[0]
    models = low.fix.split("The host's own time in ")[1].split(" leaves")[0]
    assert low.fix.startswith("The optimizer's host time") and "aten::_copy_from" not in models and "aten::empty" in models


def test_many_small_ops_of_an_eager_model_make_no_warning(tmp_path: Path) -> None:
    # 22.5% of the step over fifteen ops of 1.5% each: eager PyTorch's per-op cost, told as an info line.
    ops = small_ops([f"aten::op{i}" for i in range(15)], 1000, 150)
    found = ten_ms_step(tmp_path, ops, gap_end=3250)
    low = next(f for f in found if f.code == "low_gpu_utilization")
    assert low.severity == "info" and low.fix.startswith("The host's own time in the model's ops")


def test_one_op_that_holds_a_share_of_the_step_warns(tmp_path: Path) -> None:
    # The op launches its kernel at its end: a device op whose host time is the cost.
    op = [x_event("aten::nonzero_static", 1000, 2500), launch(3450, 9, dur=2), kernel(3455, 2, 9)]
    found = ten_ms_step(tmp_path, op, gap_end=3500)
    low = next(f for f in found if f.code == "low_gpu_utilization")
    assert low.severity == "warning" and low.fix.startswith("The host op aten::nonzero_static leaves the device idle 2.5 ms")


def test_a_compiled_models_host_time_is_told_cuda_graphs_not_to_compile_it(tmp_path: Path) -> None:
    # HTA's df_index_resolver trace: a torch.compile'd model whose host idles the device 28 ms a step inside
    # CompiledFunctionBackward. "torch.compile the model" would tell the user to do what is done.
    ops = small_ops(["CompiledFunctionBackward", "CompiledFunction", "aten::sum"], 1000, 800)
    low = next(f for f in ten_ms_step(tmp_path, ops, gap_end=3400) if f.code == "low_gpu_utilization")
    assert "the model is compiled" in low.fix and "mode='reduce-overhead'" in low.fix
    assert "torch.compile the model" not in low.fix


def test_a_compiled_graph_alone_is_told_cuda_graphs_too(tmp_path: Path) -> None:
    low = next(f for f in ten_ms_step(tmp_path, [x_event("CompiledFunction", 1000, 2400)], gap_end=3400) if f.code == "low_gpu_utilization")
    assert low.fix.startswith("The host's own time in CompiledFunction leaves") and "the model is compiled" in low.fix


def test_the_real_compiled_trace_is_told_cuda_graphs_and_the_ddp_resnet_its_models_ops() -> None:
    compiled = finding(external("hta_df_index_resolver_v100_r1of2"), "low_gpu_utilization")
    assert compiled.fix.startswith("The host's own time in the model's ops (CompiledFunctionBackward 28.2 ms")
    assert "the model is compiled" in compiled.fix
    # HTA's NCCL-parser A100 trace: the device is busy 24%; its host is in the model's ops 116.4 ms a step, against
    # 15.5 ms of launch pace and 14.7 ms of SGD. Before: launch pace and the optimizer were told, the ops not at all.
    eager = finding(external("hta_nccl_parser_a100_r0of2"), "low_gpu_utilization")
    assert eager.fix.startswith("The host's own time in the model's ops (aten::empty 13.7 ms")
    assert "116.4 ms per step" in eager.fix and "torch.compile the model" in eager.fix


@pytest.mark.parametrize(
    ("case", "second"),
    [
        ("hta_nccl_parser_a100_r0of2", "Kernels are launched no faster than they run (15.5 ms per step of launch-bound idle)"),
        ("param_dlrm_v100_8ranks", "The host's own time in the model's ops (aten::empty 0.1 ms"),
    ],
)
def test_launch_pace_beside_the_models_ops_is_told_their_one_fix_once(case: str, second: str) -> None:
    # Both are cut by fewer, bigger kernels: the second of the two says so instead of repeating the list.
    fix = finding(external(case), "low_gpu_utilization").fix
    assert second in fix and fix.endswith("the same changes cut it.")
    assert fix.count("a larger batch") == 1


def test_inductors_compiled_graph_call_is_the_compiled_graphs_host_time_not_a_phase_marker(tmp_path: Path) -> None:
    # xDiT's SD 3.5 recording: 305.6 ms a step innermost in "## Call CompiledFxGraph <hash> ##" (Inductor's wrapper
    # around calling a compiled graph). Read as a "## phase ##" marker it named nothing a fix could address.
    call = x_event("## Call CompiledFxGraph fp5r5pk7bndvtfx ##", 1000, 2400, cat="user_annotation")
    low = next(f for f in ten_ms_step(tmp_path, [call], gap_end=3400) if f.code == "low_gpu_utilization")
    assert "the model is compiled" in low.fix and "CompiledFxGraph" in low.fix


def test_a_read_inside_a_region_around_every_step_names_no_region(tmp_path: Path) -> None:
    # A record_function around the whole loop (vLLM's execute_context_...) is the step, not the reader's address.
    events = [x_event("serve_loop", -10, 3020, cat="user_annotation")]
    for i in range(3):
        o = 1000 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 1000, cat="user_annotation"),
            x_event("aten::mm", o, 500),
            x_event("aten::item", o + 600, 300),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    sync = finding(analyze_folder(tmp_path), "host_sync")
    assert "Keep loss.item()" in sync.fix and "serve_loop" not in sync.fix and not sync.fix.startswith("The region")
