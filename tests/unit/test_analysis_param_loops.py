"""A weights' average (or other tensors) updated one tensor at a time outside the model and the optimizer, told with the
option that updates them all at once (orchestrator.analysis.param_loops).

Recorded by tests/data/record_cpu_ema.py: one rank of a 16-block MLP (66 parameter tensors) keeping an exponential moving
average through diffusers' EMAModel (foreach=False, its default; the step boundary the agent's optimizer post-hook),
torch's AveragedModel(avg_fn=get_ema_avg_fn(...)), or its own mul_/add_ loop, each beside the same loop with foreach
ops, and under Lightning's Trainer with its WeightAveraging callback as Lightning's own example has it. Before: "No
findings" (or only a 0.01 ms read) on all of them, the loop's 2.5-7 ms a step left in "other". tests/data/record_cpu_fastai.py
fits the same MLP with fastai's Learner and its own Adam, which decays the weights and not the biases: an iteration of
nine ops on some tensors and eight on the others, which no loop of one form matched ("No findings", 6-9 ms a step in
"other"), beside the same Learner given torch's fused AdamW through fastai's OptimWrapper.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.param_loops import MAX_FORMS, MAX_PERIOD, MIN_ITERATIONS, _loops, owner_fix
from orchestrator.loops import Loop
from orchestrator.models.analysis import Finding, Summary
from orchestrator.traces.loader import Span
from tests.support.tracefiles import case, write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launching


def loop_finding(summary: Summary) -> Finding | None:
    return next((f for f in summary.findings if f.code == "param_loop"), None)


def test_diffusers_ema_model_is_told_to_update_with_foreach():
    summary = analyze_folder(case("cpu_ema_diffusers"))
    found = loop_finding(summary)
    assert found is not None and found.ranks == [0]
    assert found.title.startswith("The weights' average is updated one tensor at a time")
    assert "EMAModel.step (diffusers/training_utils.py:" in found.evidence
    assert "runs aten::sub, aten::mul, aten::sub_ for one tensor after another, 66 times a step" in found.evidence
    assert found.fix.startswith("Update them all at once: EMAModel(model.parameters(), foreach=True)")
    assert found.max_saving_ms > 0


def test_the_update_that_opens_the_agents_next_step_is_found_before_its_batch_fetch():
    # The step ends in the optimizer's post-hook, so each update runs before the next step fetches its batch.
    (rank,) = analyze_folder(case("cpu_ema_diffusers")).ranks
    assert rank.param_loop is not None and rank.param_loop.ops == ["aten::sub", "aten::mul", "aten::sub_"]
    assert rank.param_loop.iterations == [66] * len(rank.steps)
    assert all(ms > 0 for ms in rank.param_loop.ms)


def test_an_update_that_opens_a_step_which_fetches_no_batch_is_found_by_its_helpers_frames():
    # Batches already in memory and the agent's boundary: each step opens with AveragedModel's loop, then forward.
    (rank,) = analyze_folder(case("cpu_ema_averaged_model_in_memory")).ranks
    assert rank.param_loop is not None and rank.param_loop.iterations == [66] * len(rank.steps)
    assert (rank.param_loop.owner or "").startswith("torch/optim/swa_utils.py(")


def test_a_forward_of_identical_blocks_before_backward_is_no_update(tmp_path: Path):
    # No batch fetched, no stack: 20 residual blocks (linear, relu, add) before backward are the model's forward.
    events: list[dict[str, Any]] = []
    for i in range(3):
        o = 10_000 * i
        events.append(x_event(f"ProfilerStep#{i + 1}", o, 10_000, cat="user_annotation"))
        events += [x_event(name, o + 150 * j + 50 * n, 40) for j in range(20) for n, name in enumerate(("aten::linear", "aten::relu", "aten::add"))]
        events += [
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o + 4000, 2000),
            x_event("Optimizer.step#AdamW.step", o + 7000, 1000, cat="user_annotation"),
            x_event("aten::_fused_adamw_", o + 7100, 800),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.param_loop is None


def test_an_averaged_model_with_avg_fn_is_told_multi_avg_fn():
    found = loop_finding(analyze_folder(case("cpu_ema_averaged_model")))
    assert found is not None
    assert "AveragedModel.update_parameters (torch/optim/swa_utils.py:" in found.evidence
    assert "multi_avg_fn=get_ema_multi_avg_fn(decay)" in found.fix


def test_lightnings_weight_averaging_as_its_own_example_has_it_is_told_the_callbacks_argument():
    # Lightning's WeightAveraging docstring passes avg_fn=get_ema_avg_fn(): AveragedModel then loops on any device.
    found = loop_finding(analyze_folder(case("cpu_lightning_ema")))
    assert found is not None
    assert "WeightAveraging.on_train_batch_end (lightning/pytorch/callbacks/weight_averaging.py:" in found.evidence
    assert found.fix.startswith("Update them all at once: WeightAveraging(multi_avg_fn=get_ema_multi_avg_fn(decay))")


def test_the_loops_own_average_is_told_torch_foreach():
    found = loop_finding(analyze_folder(case("cpu_ema_own_loop")))
    assert found is not None
    assert found.title == "A Python loop updates 66 tensors one at a time outside the model and the optimizer"
    assert "update_average (record_cpu_ema.py:" in found.evidence and "aten::mul_, aten::add_" in found.evidence
    assert "torch._foreach_lerp_(averages, params, 1 - decay)" in found.fix


def test_timms_model_ema_v2_is_told_its_foreach_successor():
    # timm 1.0.31's ModelEmaV2 copies each tensor's update back one at a time (ema_v.copy_(update_fn(ema_v, model_v))).
    found = loop_finding(analyze_folder(case("cpu_ema_timm_v2")))
    assert found is not None and found.title.startswith("The weights' average is updated one tensor at a time")
    assert "ModelEmaV2._update (timm/utils/model_ema.py:" in found.evidence and "66 times a step" in found.evidence
    assert found.fix == "Update them all at once: timm.utils.ModelEmaV3(model, decay=...), which updates all tensors in foreach ops."


def test_averages_updated_with_foreach_ops_are_not_told():
    for name in ("cpu_ema_diffusers_foreach", "cpu_ema_averaged_model_foreach", "cpu_ema_timm_v3"):
        summary = analyze_folder(case(name))
        assert loop_finding(summary) is None, name
        # AveragedModel sorts its tensors by device first (aten::detach, aten::to, ... ×66): no arithmetic, no loop.
        assert all(r.param_loop is None for r in summary.ranks), name


def test_a_librarys_own_loop_over_gradients_is_found_but_not_told():
    # DeepSpeed's ZeRO-1 copies each gradient into its bucket outside any optimizer step: its settings are its fix.
    summary = analyze_folder(case("cpu_deepspeed_zero1"))
    assert all(r.param_loop is not None and "deepspeed/" in (r.param_loop.owner or "") for r in summary.ranks)
    assert loop_finding(summary) is None


def test_fastais_own_optimizer_is_told_torchs_fused_adamw_through_its_optimwrapper():
    summary = analyze_folder(case("cpu_fastai_adam"))
    found = loop_finding(summary)
    assert summary.loop is Loop.FASTAI and found is not None and found.ranks == [0]
    assert found.title.startswith("fastai's own optimizer updates the parameters one tensor at a time")
    assert "Optimizer.step (fastai/optimizer.py:" in found.evidence and "66 times a step" in found.evidence
    assert found.fix.startswith(
        "Update them all at once: a torch optimizer through fastai's OptimWrapper, Learner(..., "
        "opt_func=partial(OptimWrapper, opt=torch.optim.AdamW, fused=True, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01))"
    )


def test_a_loop_that_branches_per_tensor_counts_every_tensor_once():
    # fastai's Adam: mul_ (weight decay) first on the 17 weights, not on the 49 biases and norm parameters.
    (rank,) = analyze_folder(case("cpu_fastai_adam")).ranks
    assert rank.param_loop is not None and rank.param_loop.iterations == [66] * len(rank.steps)
    assert rank.param_loop.ops == [
        "aten::mul_", "aten::add_", "aten::mul_", "aten::addcmul_", "aten::div", "aten::sqrt", "aten::add", "aten::addcdiv_"
    ]


def test_fastais_own_optimizer_is_the_steps_optimizer_phase():
    # No Optimizer.step span marks it: its loop's time was "other", and the optimizer phase 0 ms.
    (rank,) = analyze_folder(case("cpu_fastai_adam")).ranks
    assert rank.param_loop is not None
    for step, ms in zip(rank.steps, rank.param_loop.ms):
        assert step.phases.optimizer == pytest.approx(ms)
        assert step.phases.total() == pytest.approx(step.duration_ms, rel=1e-6)


def test_fastai_given_torchs_fused_adamw_is_not_told():
    summary = analyze_folder(case("cpu_fastai_adamw_fused"))
    assert summary.loop is Loop.FASTAI and loop_finding(summary) is None
    assert all(r.param_loop is None for r in summary.ranks)


def test_who_owns_the_loop_decides_the_fix():
    assert owner_fix("diffusers/training_utils.py(811): EMAModel.step") == (
        "EMAModel(model.parameters(), foreach=True): diffusers' EMAModel updates one parameter at a time unless told"
    )
    assert "ModelEmaV3" in (owner_fix("timm/utils/model_ema.py(121): ModelEmaV2._update") or "")
    assert "torch._foreach_lerp_" in (owner_fix("train.py(40): update_ema") or "")
    assert "torch._foreach_lerp_" in (owner_fix("/home/me/project/train.py(40): update_ema") or "")
    # torch's own code takes foreach kernels where it can; a library's loop and a loop no stack names get no advice.
    assert owner_fix("torch/nn/utils/clip_grad.py(90): _clip_grads_with_norm_") is None
    assert owner_fix("deepspeed/runtime/utils.py(427): clip_grad_norm_") is None
    assert owner_fix(None) is None


def _ops(names: list[str], start: float = 0.0) -> list[Span]:
    return [Span(start + 10 * i, start + 10 * i + 5, n, "cpu_op", 1, 1) for i, n in enumerate(names)]


@given(
    period=st.lists(st.sampled_from(["aten::mul_", "aten::add_", "aten::lerp_", "aten::sub", "aten::copy_"]), min_size=1, max_size=4, unique=True),
    iterations=st.integers(min_value=MIN_ITERATIONS, max_value=80),
    before=st.lists(st.sampled_from(["aten::view", "aten::linear", "aten::mm"]), max_size=5),
    after=st.lists(st.sampled_from(["aten::view", "aten::linear", "aten::mm"]), max_size=5),
)
def test_a_planted_loop_is_found_with_its_iterations(period: list[str], iterations: int, before: list[str], after: list[str]):
    runs = _loops(_ops(before + period * iterations + after))
    (run,) = runs.values()
    assert run.iterations == iterations and sorted(run.ops) == sorted(period)


@given(
    period=st.lists(st.sampled_from(["aten::view", "aten::detach", "aten::to", "aten::t"]), min_size=1, max_size=4, unique=True),
    iterations=st.integers(min_value=0, max_value=60),
)
def test_a_loop_without_arithmetic_or_of_few_iterations_is_no_update(period: list[str], iterations: int):
    assert _loops(_ops(period * iterations)) == {}
    assert _loops(_ops(["aten::mul_", "aten::add_"] * (MIN_ITERATIONS - 1))) == {}


def _repeats(order: list[bool]) -> bool:
    return any(all(order[i] == order[i + p] for i in range(len(order) - p)) for p in range(1, MAX_PERIOD + 1))


@given(
    body=st.lists(st.sampled_from(["aten::mul_", "aten::add_", "aten::addcmul_", "aten::div", "aten::sqrt", "aten::addcdiv_"]), min_size=1, max_size=6, unique=True),
    extra=st.sampled_from(["aten::mul", "aten::clamp_", "aten::neg"]),
    at=st.integers(min_value=0, max_value=6),
    # Forms in an order that repeats (weight, bias, weight, bias) read as one longer iteration: planted in none.
    branches=st.lists(st.booleans(), min_size=MIN_ITERATIONS, max_size=80).filter(lambda b: 2 <= sum(b) <= len(b) - 2 and not _repeats(b)),
    before=st.lists(st.sampled_from(["aten::view", "aten::linear", "aten::mm"]), max_size=5),
)
def test_a_loop_whose_iterations_take_two_forms_is_found_once_per_tensor(
    body: list[str], extra: str, at: int, branches: list[bool], before: list[str]
):
    # One op more on two tensors or more (a weight decay the biases skip), anywhere in the iteration.
    longer = body[:at] + [extra] + body[at:]
    (run,) = _loops(_ops(before + [x for b in branches for x in (longer if b else body)])).values()
    assert run.iterations == len(branches)
    assert run.ops in (body, longer) or sorted(run.ops) in (sorted(body), sorted(longer))


def test_the_code_after_a_loop_that_ends_in_its_last_op_is_no_iteration():
    # DeepSpeed's BF16 optimizer: 18 × (view, add_, to), then its buckets flattened and copied (one 9.7 ms aten::to).
    loop = ["aten::view", "aten::add_", "aten::to"] * 18
    after = ["aten::view", "aten::add_", "aten::_is_mkldnn_fp16_supported", "aten::flatten_dense_tensors", "aten::to"]
    (run,) = _loops(_ops(loop + after)).values()
    assert run.iterations == 18 and run.ops == ("aten::view", "aten::add_", "aten::to")


def test_a_loop_of_more_forms_than_the_bound_is_not_one_loop():
    forms = [["aten::mul_", "aten::add_"], ["aten::mul", "aten::mul_", "aten::add_"], ["aten::neg", "aten::mul_", "aten::add_"]]
    assert len(forms) > MAX_FORMS
    order = random.Random(0).choices(range(3), k=3 * MIN_ITERATIONS)  # in no order that repeats
    assert _loops(_ops([x for i in order for x in forms[i]])) == {}


def test_a_pause_inside_the_loop_leaves_one_loop_of_two_stretches():
    ops = _ops(["aten::lerp_"] * 20) + _ops(["aten::lerp_"] * 20, start=10_000)
    (run,) = _loops(ops).values()
    assert run.iterations == 40 and len(run.spans) == 2


def _device_steps(tmp_path: Path) -> Summary:
    """Three 10 ms GPU steps: a backward node's 3 ms kernel, then the user's update_ema launching 20 × (mul_, add_),
    each a 5 µs kernel, over 2 ms while the device idles; a with_stack frame names the function."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        o, c = 10_000 * i, 1000 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 10_000, cat="user_annotation"),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o, 500),
            x_event("cudaLaunchKernel", o + 100, 5, cat="cuda_runtime", correlation=c), kernel(o + 110, 3000, c),
            x_event("train.py(40): update_ema", o + 4000, 2000, cat="python_function"),
        ]
        for j in range(40):
            t = o + 4000 + 50 * j
            name = "aten::mul_" if j % 2 == 0 else "aten::add_"
            events += launching(name, t, 40, 5, c + 1 + j)
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_on_a_device_the_loop_costs_at_most_the_idle_time_of_its_step(tmp_path: Path):
    summary = _device_steps(tmp_path)
    (rank,) = summary.ranks
    found = loop_finding(summary)
    assert found is not None and rank.idle is not None
    assert rank.param_loop is not None and rank.param_loop.iterations == [20, 20, 20]
    assert found.max_saving_ms <= rank.idle.idle_ms_per_step
    assert "update_ema (train.py:40)" in found.evidence and "each of them is a kernel launch" in found.evidence


_ADAM = ["aten::mul_", "aten::add_", "aten::mul_", "aten::addcmul_", "aten::div", "aten::sqrt", "aten::add", "aten::addcdiv_"]


def _fastai_on_a_device(tmp_path: Path) -> Summary:
    """Four 25 ms GPU steps of a fastai Learner: a batch fetched, 40 forward ops of 150 µs kernels, a backward node
    of 40 kernels, then fastai's Adam over 66 tensors (a weight decay on every fourth): each op 14 µs of host time
    launching a 4 µs kernel, with_stack frames naming Optimizer.step."""
    events: list[dict[str, Any]] = []

    def op(name: str, t: float, host: float, device: float) -> None:
        events.extend(launching(name, t, host, device, len(events)))

    for i in range(4):
        o = 25_000 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 25_000, cat="user_annotation"),
            x_event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", o + 100, 300, cat="user_annotation"),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o + 6_400, 8_000),
        ]
        for j in range(40):
            op("aten::linear", o + 400 + 150 * j, 20, 150)
            op("aten::mm", o + 6_400 + 200 * j, 20, 195)
        t = start = o + 14_600
        for p in range(66):
            for name in (["aten::mul_"] if p % 4 == 0 else []) + _ADAM:
                op(name, t, 14, 4)
                t += 15
        events.append(x_event("fastai/optimizer.py(114): Optimizer.step", start - 5, t - start + 10, cat="python_function"))
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_on_a_device_a_told_loops_idle_time_is_its_own_findings(tmp_path: Path):
    # The loop's launches outpace nothing: 4 µs kernels for 15 µs of host time. Before, the device idle finding counted
    # that time as launch pace and told torch.compile(learn.model), a change to the model that leaves the loop as it is.
    summary = _fastai_on_a_device(tmp_path)
    (rank,) = summary.ranks
    found = loop_finding(summary)
    assert found is not None and found.severity == "warning" and summary.findings[0] == found
    assert rank.param_loop is not None and rank.param_loop.iterations == [66] * 4
    assert not any(f.code == "low_gpu_utilization" for f in summary.findings)
    assert all("torch.compile" not in f.fix for f in summary.findings)
