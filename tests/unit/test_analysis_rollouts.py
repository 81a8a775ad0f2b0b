"""Environment rollouts inside the training loop, told with the vectorized environment that shares the policy's calls
(orchestrator.analysis.generation's rollout).

Recorded by tests/data/record_cpu_sb3.py: stable-baselines3's PPO on CartPole-v1, unmodified, one whole cycle of 16
optimizer steps, the first of which collects the next rollout. Before: the report's first line was a 7% optimizer info
line and its verdict "No warning", while collect_rollouts held 72% of the time (measured unprofiled).
"""

from __future__ import annotations

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.generation import GENERATE_FILE, ROLLOUT_REGION, generation_of, with_generation
from orchestrator.loops import Loop
from orchestrator.traces.loader import Span
from tests.support.tracefiles import case

_COLLECT = "stable_baselines3/common/on_policy_algorithm.py(202): OnPolicyAlgorithm.collect_rollouts"
_LEARN = "stable_baselines3/common/on_policy_algorithm.py(324): OnPolicyAlgorithm.learn"


def frame(name: str, ts: float, end: float) -> Span:
    return Span(ts=ts, end=end, name=name, cat="python_function", pid=0, tid=0)


def test_ppos_rollout_is_the_first_finding_with_vectorized_environments_as_its_fix():
    summary = analyze_folder(case("cpu_sb3_ppo"))
    found = summary.findings[0]
    assert found.code == "rollout" and found.severity == "warning" and found.ranks == [0]
    assert found.title.startswith("Collecting rollouts takes ")
    assert "OnPolicyAlgorithm.collect_rollouts (stable_baselines3/common/on_policy_algorithm.py:" in found.evidence
    assert "It ran in 1 of the 16 steps (step 16)" in found.evidence
    assert "make_vec_env(env_id, n_envs=N)" in found.fix and "set_default_validate_args(False)" in found.fix
    (rank,) = summary.ranks
    assert rank.generation is not None and rank.generation.kind == "env"
    assert [s.step for s, ms in zip(rank.steps, rank.generation.ms, strict=True) if ms > 0] == [16]
    # Its bound is the rollout's share of the window, most of forward's (where the phases count the policy's calls).
    assert 0.5 < found.max_saving_fraction < rank.mean_phases.forward / (rank.mean_step_ms or 1)


def test_four_environments_per_call_still_lead_with_the_rollout():
    # A DummyVecEnv of four halves the cycle (unprofiled), and the collecting step is still its largest part.
    found = analyze_folder(case("cpu_sb3_ppo_vec4")).findings[0]
    assert found.code == "rollout" and "on_policy_algorithm.py:" in found.evidence


def test_the_loop_is_stable_baselines3s_and_the_optimizer_fix_names_its_policy_kwargs():
    summary = analyze_folder(case("cpu_sb3_ppo"))
    assert summary.loop is Loop.STABLE_BASELINES3
    optimizer = next(f for f in summary.findings if f.code == "optimizer_host")
    assert "In stable-baselines3's learn(): PPO(..., policy_kwargs=dict(optimizer_kwargs=dict(fused=True)))" in optimizer.fix


@pytest.mark.parametrize("name", ["cpu_trl_grpo", "cpu_hf_trainer", "cpu_lightning", "cpu_skorch"])
def test_a_loop_that_steps_no_environment_is_not_told(name):
    summary = analyze_folder(case(name))
    assert not any(f.code == "rollout" for f in summary.findings)
    assert all(r.generation is None or r.generation.kind == "text" for r in summary.ranks)


def test_the_collecting_frame_is_the_caller_and_its_time_is_per_step():
    frames = [frame(_LEARN, 0, 100), frame(_COLLECT, 10, 60), frame("torch/nn/modules/module.py(1789): Module._call_impl", 20, 30)]
    gen = generation_of(frames, [(0.0, 50.0), (50.0, 100.0)])
    assert gen is not None and gen.kind == "env" and gen.caller == _COLLECT
    assert gen.ms == [pytest.approx(0.04), pytest.approx(0.01)]


def test_a_function_named_collect_rollouts_outside_stable_baselines3_is_not_told():
    assert generation_of([frame("my_rl/loop.py(40): collect_rollouts", 0, 50)], [(0.0, 100.0)]) is None


def test_text_generation_is_told_over_an_environment_rollout_in_the_same_frames():
    # An RL loop that generates text inside an SB3-style collection is a language model's rollout first.
    frames = [frame(_COLLECT, 0, 80), frame(f"{GENERATE_FILE}(3008): GenerationMixin.generate", 10, 50)]
    gen = generation_of(frames, [(0.0, 100.0)])
    assert gen is not None and gen.kind == "text"


def test_on_a_device_a_rollouts_stretches_are_regions_of_its_own():
    gen = generation_of([frame(_COLLECT, 10, 60)], [(0.0, 100.0)])
    (region,) = with_generation([], gen)
    assert region.name.startswith(ROLLOUT_REGION) and (region.ts, region.end) == (10, 60)
