"""Phases from nesting (issue 29): the innermost recognised span decides, so the forward and
backward that a closure optimizer runs inside ``Optimizer.step`` are forward and backward."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.intervals import total, union
from orchestrator.analysis.phases import innermost
from orchestrator.analysis.spans import is_backward
from orchestrator.models.analysis import PHASES, PhaseTimes
from orchestrator.traces.loader import Span
from tests.support.realtraces import EXTERNAL_CASES, external, h100
from tests.support.tracefiles import case, load_trace, write_trace, x_event


def _span(name: str, cat: str = "cpu_op") -> Span:
    return Span(ts=0.0, end=1.0, name=name, cat=cat, pid=1, tid=1)


@pytest.mark.parametrize("name", ["closure_adam", "closure_lbfgs"])
def test_a_closure_optimizers_forward_and_backward_are_not_optimizer_time(name: str) -> None:
    # Recorded with torch.profiler: optimizer.step(closure), the closure runs zero_grad, the model, the loss
    # and loss.backward() inside Optimizer.step#....step. Before nesting decided, backward was 0 ms and
    # nearly the whole step was "optimizer".
    folder = case(name)
    (rank,) = analyze_folder(folder).ranks
    # What the autograd engine ran on the main thread inside the profiled steps, per step.
    (path,) = (folder / "traces").iterdir()
    events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    engine = union(
        (e["ts"], e["ts"] + e["dur"]) for e in events
        if e["name"].startswith("autograd::engine::evaluate_function") and any(a <= e["ts"] < b for a, b in steps)
    )
    assert rank.mean_phases.backward == pytest.approx(total(engine) / 1000 / len(steps), rel=0.05)
    assert rank.mean_phases.forward > 0
    for step in rank.steps:
        assert step.phases.total() == pytest.approx(step.duration_ms, rel=1e-6)


def _phases(folder: Path, events: list[dict]) -> PhaseTimes:
    """The mean phases of a one-rank trace of ``events``, written to ``folder``."""
    write_trace(folder / "rank0.pt.trace.json", events, world_size=1)
    (rank,) = analyze_folder(folder).ranks
    return rank.mean_phases


def test_a_closures_backward_run_by_the_autograd_thread_is_backward(tmp_path: Path) -> None:
    # GPU-shaped: inside Optimizer.step the main thread runs the closure's forward ops, then waits in no op while
    # the autograd engine's device thread runs backward, then does the optimizer's own update.
    p = _phases(tmp_path, [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("Optimizer.step#Adam.step", 100, 800, cat="user_annotation"),
        x_event("Optimizer.zero_grad#Adam.zero_grad", 100, 10, cat="user_annotation"),
        x_event("aten::linear", 120, 180),
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 310, 380, tid=2),
        x_event("aten::add_", 700, 180),
    ])
    # forward: before the step (100 µs) and the step's own time before the first backward (110-310 µs).
    assert (p.forward, p.backward, p.optimizer, p.other) == pytest.approx((0.3, 0.38, 0.22, 0.1))


def test_a_closures_wait_for_ddps_all_reduce_on_gloo_is_communication(tmp_path: Path) -> None:
    # Lightning under DDP on gloo (CPU): after the closure's backward the main thread waits inside
    # Optimizer.step, in no op of its own, while gloo's worker thread runs the gradients' all-reduce. Before, that
    # wait (1.4 of 3.7 ms in a live Lightning job) was the optimizer's.
    p = _phases(tmp_path, [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("Optimizer.step#Adam.step", 100, 800, cat="user_annotation"),
        x_event("aten::linear", 120, 180),
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 310, 190),
        x_event("gloo:all_reduce", 510, 280, cat="user_annotation", tid=2),
        x_event("aten::add_", 800, 90),
    ])
    # comm: the all-reduce while the main thread runs nothing (510-790 µs); optimizer: the rest of its own time.
    assert (p.forward, p.backward, p.comm, p.optimizer, p.other) == pytest.approx((0.31, 0.19, 0.28, 0.12, 0.1))


def _frame(name: str, ts: float, dur: float) -> dict:
    return x_event(name, ts, dur, cat="python_function")


def test_what_a_closure_runs_after_its_backward_is_the_loops_own_not_the_optimizers(tmp_path: Path) -> None:
    # with_stack, Composer's Trainer as recorded: Adam.step calls the closure, which runs the model and the loss,
    # backward, then updates a training metric (ops of its own); the optimizer's own update follows the closure.
    events = [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("Optimizer.step#Adam.step", 100, 800, cat="user_annotation"),
        _frame("torch/optim/adam.py(213): step", 105, 790),
        _frame("composer/trainer/trainer.py(2685): <lambda>", 110, 590),
        x_event("aten::linear", 120, 180),
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 310, 190),
        x_event("aten::argmax", 520, 170),  # the metric's update, in the closure
        x_event("aten::add_", 710, 180),  # the optimizer's update
    ]
    p = _phases(tmp_path, events)
    # other: before and after the step (100 µs) and the closure's rest after backward (500-700 µs).
    assert (p.forward, p.backward, p.optimizer, p.other) == pytest.approx((0.31, 0.19, 0.2, 0.3))


def test_a_library_optimizers_own_step_and_its_helpers_are_no_closure(tmp_path: Path) -> None:
    # Composer's DecoupledAdamW: its step (code outside torch) is called by torch's hook wrapper, and calls its own
    # helper (adamw) as it would call a closure.
    p = _phases(tmp_path, [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("Optimizer.step#DecoupledAdamW.step", 100, 800, cat="user_annotation"),
        _frame("torch/optim/optimizer.py(485): wrapper", 105, 790),
        _frame("composer/optim/decoupled_weight_decay.py(246): step", 110, 780),
        _frame("composer/optim/decoupled_weight_decay.py(120): adamw", 115, 770),
        x_event("aten::add_", 120, 760),
    ])
    assert p.optimizer == pytest.approx(0.8)


def test_a_region_waiting_while_the_autograd_thread_runs_backward_is_backward(tmp_path: Path) -> None:
    # DeepSeek's DualPipe training trace (H800): the main thread opens record_function regions around the whole
    # step ("1F1B") and each chunk ("attn(F)", "attn(B)"); in a backward chunk it runs no op of its own while the
    # autograd engine's device thread runs the backward nodes. Before, any open region counted as the main
    # thread's own work: backward was 0.5 ms of a 112 ms step, the rest forward and other.
    phases = _phases(tmp_path, [
        x_event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x_event("1F1B", 10, 980, cat="user_annotation"),
        x_event("attn(F)", 20, 300, cat="user_annotation"),
        x_event("aten::linear", 30, 280),
        x_event("attn(B)", 400, 500, cat="user_annotation"),
        x_event("autograd::engine::evaluate_function: AddmmBackward0", 420, 450, tid=2),
    ])
    assert phases.backward == pytest.approx(0.45)


def test_without_profiler_steps_the_python_thread_is_main_though_the_autograd_thread_is_busier(tmp_path: Path) -> None:
    # TraceLens' MI300 DDP ResNet-18 trace: no ProfilerStep; the autograd thread (backward, 528 ms an iteration)
    # is busier than the Python thread (forward 144 ms, SGD). Before, the autograd thread was taken for main: no
    # forward at all, no step definition, iterations cut at MseLossBackward0.
    events = []
    for i in range(4):
        o = 1000 * i
        events += [
            x_event("nn.Module: Net_0", o, 200, cat="python_function"),
            x_event("aten::linear", o + 10, 180),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o + 210, 700, tid=2),
            x_event("Optimizer.step#SGD.step", o + 920, 60, cat="user_annotation"),
            x_event("aten::add_", o + 930, 40),
            x_event("kernel", o + 20, 900, cat="kernel", pid=0, tid=7, stream=7, device=0),
        ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    rank = analyze_folder(tmp_path).ranks[0]
    assert rank.step_definition == "1 step = SGD.step ×1; 1 forward pass (Net_0)"
    assert rank.mean_phases.forward == pytest.approx(0.2) and rank.mean_phases.backward > 0.5


def _checkpointed_steps(steps: int = 3) -> list[dict]:
    """A CPU loop whose Block is checkpointed: its forward runs in the step's forward and again inside backward's
    CheckpointFunctionBackward, with the nn.Module spans with_stack records."""
    events = []
    for i in range(steps):
        o = 1000 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 1000, cat="user_annotation"),
            x_event("nn.Module: Net_0", o + 100, 200, cat="python_function"),
            x_event("nn.Module: Block_0", o + 150, 100, cat="python_function"),
            x_event("aten::linear", o + 160, 80),
            x_event("autograd::engine::evaluate_function: CheckpointFunctionBackward", o + 400, 500),
            x_event("nn.Module: Block_0", o + 450, 150, cat="python_function"),
            x_event("aten::linear", o + 460, 130),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o + 650, 200),
        ]
    return events


def test_a_checkpointed_blocks_forward_recomputed_inside_backward_is_backward(tmp_path: Path) -> None:
    # torch.utils.checkpoint (a Trainer's gradient_checkpointing) runs the block's forward again for backward: that
    # is backward's cost. Before, with_stack's nn.Module spans made it forward (forward 0.55 ms, backward 0.35),
    # while a trace without them called the same time backward. Forward: the step's time before backward.
    p = _phases(tmp_path, _checkpointed_steps())
    assert (p.forward, p.backward, p.other) == pytest.approx((0.4, 0.5, 0.1))


def test_a_checkpointed_blocks_recomputation_is_no_forward_pass(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.pt.trace.json", _checkpointed_steps(), world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    assert rank.step_definition == "1 step = no optimizer step; 1 forward pass (Net_0)"


def test_a_trainers_gradient_checkpointing_is_one_forward_pass_and_its_recomputation_backward() -> None:
    # Recorded: a Hugging Face Trainer with gradient_checkpointing=True and with_stack=True. Before, one step read
    # "9 forward passes (GPT2Attention_0 ×1, ..., LayerNorm_3 ×1)" and forward 32.8 ms, backward 13.2 ms; the same
    # job recorded without with_stack: forward 10.4 ms, backward 13.7 ms.
    (rank,) = analyze_folder(case("cpu_hf_trainer_checkpointing")).ranks
    assert rank.step_definition == "1 step = AdamW.step ×1; 1 forward pass (GPT2LMHeadModel_0)"
    assert rank.mean_phases.backward > rank.mean_phases.forward


def test_innermost_gives_each_instant_to_the_innermost_labelled_span() -> None:
    # The primitive alone (nested_phases relabels a recomputed forward inside backward before asking it).
    found = innermost([(0, 100, "backward"), (10, 30, "forward"), (50, 60, "forward"), (55, 58, "backward")])
    assert found == {"backward": [(0, 10), (30, 50), (55, 58), (60, 100)], "forward": [(10, 30), (50, 55), (58, 60)]}


def test_a_child_spilling_past_its_parent_by_rounding_is_still_innermost() -> None:
    found = innermost([(0, 100, "step"), (90, 100.5, "backward")])
    assert found == {"step": [(0, 90)], "backward": [(90, 100.5)]}


@pytest.mark.parametrize(
    "name",
    [
        "autograd::engine::evaluate_function: CompiledFunctionBackward",
        "CompiledFunctionBackward",
        "Torch-Compiled Region: !0/0/0",  # compiled autograd's graph
        "## backward ##",
        "autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward",
    ],
)
def test_the_autograd_engine_and_compiled_backward_are_backward(name: str) -> None:
    assert is_backward(_span(name))


@pytest.mark.parametrize(
    "name",
    [
        "Torch-Compiled Region: 0/0",
        "CompiledFunction",
        "nccl:all_reduce",
        # FSDP2 applies this Function in each unit's forward (tests/data/traces/cpu_fsdp2); its node is the backward.
        "RegisterPostBackwardFunction",
    ],
)
def test_a_compiled_forward_or_a_collective_is_not_backward(name: str) -> None:
    assert not is_backward(_span(name))


@pytest.mark.parametrize("name", EXTERNAL_CASES)
def test_phases_still_add_up_on_every_real_trace(name: str) -> None:
    for rank in external(name).ranks:
        for step in rank.steps:
            assert step.phases.total() == pytest.approx(step.duration_ms, rel=1e-6)
            assert all(step.phases.get(p) >= -1e-9 for p in PHASES)


def test_a_plain_optimizer_step_stays_optimizer_time() -> None:
    # The H100 recordings call optimizer.step() with no closure: its time is the optimizer's, as before.
    for name in ("seed003_before", "seed003_after"):
        (rank,) = h100(name).ranks
        assert rank.mean_phases.optimizer > 0.5 and rank.mean_phases.backward > 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(1, 50), st.sampled_from(["forward", "backward", "optimizer", "step"])),
        max_size=12,
    )
)
def test_innermost_gives_every_instant_of_any_span_to_exactly_one_label(raw: list[tuple[int, int, str]]) -> None:
    # Any spans, nested or overlapping as a trace from outside may have them: the labels' intervals are disjoint
    # and together cover exactly the spans' union.
    spans = [(float(a), float(a + d), label) for a, d, label in raw]
    found = innermost(spans)  # type: ignore[arg-type]
    every = sorted(iv for ivs in found.values() for iv in ivs)
    assert all(a[1] <= b[0] for a, b in zip(every, every[1:]))
    assert union(every) == union((a, b) for a, b, _ in spans)


def test_compiled_autograds_region_is_backward() -> None:
    # Recorded: a torch.compile'd model whose loss.backward() runs under compiled autograd, as one
    # "Torch-Compiled Region: !0/1/0" span with no autograd-engine node inside it.
    folder = case("compiled_autograd")
    (rank,) = analyze_folder(folder).ranks
    (path,) = (folder / "traces").iterdir()
    events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    regions = union(
        (e["ts"], e["ts"] + e["dur"]) for e in events
        if e["name"].startswith("Torch-Compiled Region: !") and any(a <= e["ts"] < b for a, b in steps)
    )
    assert rank.mean_phases.backward == pytest.approx(total(regions) / 1000 / len(steps), rel=0.05)
