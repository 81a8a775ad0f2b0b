"""Text generation inside the training step, told with the engine that generates faster
(orchestrator.analysis.generation).

Recorded by tests/data/record_cpu_grpo.py: TRL 1.16's GRPOTrainer, unmodified, on a two-layer GPT-2 built from a config,
8 completions of 16 tokens a step. Before: one info line about reads and one about activation checkpointing; the
generation's half of the step stood in "forward" with nothing said about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.generation import GENERATE_FILE, _callers, generation_of
from orchestrator.analysis.python_frames import user_frames
from orchestrator.models.analysis import Finding, Summary
from orchestrator.traces.loader import Span
from tests.support.tracefiles import case, write_trace, x_event
from tests.unit.test_analysis_idle_causes import launching


def generation_finding(summary: Summary) -> Finding | None:
    return next((f for f in summary.findings if f.code == "generation"), None)


def frame(name: str, ts: float, end: float) -> Span:
    return Span(ts=ts, end=end, name=name, cat="python_function", pid=0, tid=0)


def test_trl_grpo_generation_is_the_first_finding_with_trls_vllm_option():
    summary = analyze_folder(case("cpu_trl_grpo"))
    found = summary.findings[0]
    assert found.code == "generation" and found.severity == "warning" and found.ranks == [0]
    assert "GRPOTrainer._generate_single_turn (trl/trainer/grpo_trainer.py:" in found.evidence
    assert "use_vllm=True" in found.fix and "cache_implementation='static'" in found.fix
    (rank,) = summary.ranks
    assert rank.generation is not None and len(rank.generation.ms) == len(rank.steps) == 3
    # Generation is forward's ops without gradients: inside the forward phase, and most of it.
    assert 0.3 < found.max_saving_fraction < rank.mean_phases.forward / (rank.mean_step_ms or 1)


@pytest.mark.parametrize("name", ["cpu_hf_trainer", "cpu_peft_lora", "cpu_hf_trainer_stacks", "cpu_lightning"])
def test_a_loop_that_generates_nothing_is_not_told(name):
    summary = analyze_folder(case(name))
    assert generation_finding(summary) is None and all(r.generation is None for r in summary.ranks)


def test_with_stack_frames_name_the_caller_outside_transformers_and_a_wrappers_generate():
    frames = user_frames([
        frame("my_rl/rollout.py(10): collect", 0, 100),
        frame("peft/peft_model.py(1900): generate", 5, 95),  # PEFT hands over to transformers' generate
        frame(f"{GENERATE_FILE}(2000): generate", 10, 90),
        frame(f"{GENERATE_FILE}(2500): _sample", 12, 88),
        frame("trl/trainer/utils.py(1609): _fused_forward", 20, 30),  # called from inside generate: not its caller
    ])
    gen = generation_of(frames, [(0.0, 50.0), (50.0, 100.0)])
    assert gen is not None and gen.caller == "my_rl/rollout.py(10): collect"
    assert gen.ms == [pytest.approx(0.04), pytest.approx(0.04)]


def test_stack_samples_name_the_frame_above_generate_in_the_same_sample():
    # A sample's frames share its stretch, outermost first: the caller is the one just above generate.
    frames = [
        frame("trl/trainer/grpo_trainer.py(1512): GRPOTrainer.training_step", 0, 5),
        frame("trl/trainer/grpo_trainer.py(1873): GRPOTrainer._generate_single_turn", 0, 5),
        frame(f"{GENERATE_FILE}(3008): GenerationMixin.generate", 0, 5),
        frame("trl/trainer/utils.py(1609): _fused_forward", 0, 5),
    ]
    gen = generation_of(frames, [(0.0, 10.0)])
    assert gen is not None and gen.caller == "trl/trainer/grpo_trainer.py(1873): GRPOTrainer._generate_single_turn"


def test_a_function_named_generate_outside_transformers_is_not_generation():
    frames = [frame("my_data/synth.py(3): generate", 0, 50)]
    assert generation_of(frames, [(0.0, 100.0)]) is None


@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 500), st.booleans()), max_size=30),
       st.lists(st.floats(1, 400), min_size=1, max_size=5))
def test_generation_never_exceeds_the_steps_it_is_counted_in(spans, lengths):
    frames = user_frames([
        frame(f"{GENERATE_FILE}(1): generate" if gen else "my/loop.py(1): step", ts, ts + width) for ts, width, gen in spans
    ])
    windows, start = [], 0.0
    for length in lengths:
        windows.append((start, start + length))
        start += length
    gen = generation_of(frames, windows)
    if gen is not None:
        assert all(0 <= ms * 1000 <= b - a + 1e-6 for ms, (a, b) in zip(gen.ms, windows, strict=True))


def test_a_rollout_every_few_steps_still_warns_on_its_mean_and_says_which_steps():
    summary = analyze_folder(case("cpu_trl_grpo_iterations"))  # num_iterations=3: one step in three generates
    found = summary.findings[0]
    assert found.code == "generation" and found.severity == "warning"
    assert "It ran in 1 of the 3 steps (step 3)" in found.evidence and "num_iterations" in found.evidence
    (rank,) = summary.ranks
    assert rank.generation is not None and sorted(v > 0 for v in rank.generation.ms) == [False, False, True]


def test_an_evaluations_generation_is_not_the_training_steps():
    frames = [
        frame("transformers/trainer.py(4000): Trainer.evaluate", 0, 40),
        frame("transformers/trainer_seq2seq.py(300): Seq2SeqTrainer.prediction_step", 0, 40),
        frame(f"{GENERATE_FILE}(3008): GenerationMixin.generate", 0, 40),
    ]
    assert generation_of(frames, [(0.0, 100.0)]) is None


def _rollouts_on_a_device(tmp_path: Path) -> Summary:
    """Three 30 ms GPU steps of an RL fine-tune: 15 ms of TRL's generation, 100 ops of 40 µs host time each launching
    a 5 µs kernel (a token's small kernels), then a training forward and backward whose 300-400 µs kernels keep the
    device busy; with_stack frames name generate and its caller."""
    events: list[dict[str, Any]] = []

    def op(name: str, t: float, host: float, device: float) -> None:
        events.extend(launching(name, t, host, device, len(events)))

    for i in range(3):
        o = 30_000 * i
        events += [
            x_event(f"ProfilerStep#{i + 1}", o, 30_000, cat="user_annotation"),
            x_event("trl/trainer/grpo_trainer.py(1873): _generate_single_turn", o + 100, 15_000, cat="python_function"),
            x_event(f"{GENERATE_FILE}(3008): generate", o + 200, 14_800, cat="python_function"),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", o + 22_000, 8_000),
        ]
        for j in range(100):
            op("aten::linear", o + 300 + 140 * j, 40, 5)
        for j in range(20):
            op("aten::linear", o + 15_500 + 320 * j, 20, 300)
            op("aten::mm", o + 22_000 + 400 * j, 20, 390)
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return analyze_folder(tmp_path)


def test_on_a_device_generations_idle_time_is_its_own_findings(tmp_path: Path):
    # A token's kernels outpace nothing: 5 µs kernels for 40 µs of host time. That idle is generation's cost, told
    # with generation's fix; the device idle finding leaves it out, as it leaves out a told loop over tensors'.
    summary = _rollouts_on_a_device(tmp_path)
    (rank,) = summary.ranks
    found = summary.findings[0]
    assert found.code == "generation" and found.severity == "warning", [(f.code, f.title) for f in summary.findings]
    assert rank.generation is not None and rank.generation.stretches and rank.idle is not None
    utilization = next((f for f in summary.findings if f.code == "low_gpu_utilization"), None)
    assert utilization is None or "the generation" in utilization.evidence, utilization
    assert utilization is None or utilization.max_saving_ms < rank.idle.idle_ms_per_step - 10, utilization


@given(st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_the_callers_of_a_sampled_frame_are_the_frames_above_it_in_its_own_sample(depths):
    # Each sample's stack as frames over its own stretch, outermost first (Timeline.frames): the callers found for a
    # sample's innermost frame are exactly its sample's others, whatever the depths of the samples around it.
    frames, innermost, expected = [], set(), {}
    for n, depth in enumerate(depths):
        first = len(frames)
        frames += [frame(f"my/loop.py({d}): f{d}", 10.0 * n, 10.0 * n + 10) for d in range(depth)]
        innermost.add(len(frames) - 1)
        expected[len(frames) - 1] = list(range(first, len(frames) - 1))
    assert _callers(frames, innermost) == expected
