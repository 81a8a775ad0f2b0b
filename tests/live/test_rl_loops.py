"""Live, hook-only: reinforcement learning rayprof did not write, and what its report says first.

TRL's ``GRPOTrainer`` (tests/jobs/rl_loops.py) generates its completions with transformers' generate inside every
training step. One step is its one optimizer's; the report names the generation first, with TRL's own option to move
it to vLLM (orchestrator/analysis/generation.py). Before that rule the same job's report led with no warning at all.
stable-baselines3's PPO steps its environment in the step that collects, one in 4: a window of 8 steps holds two,
and the report names it first with vectorized environments; the agent reads SB3's learn() as the loop.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.loops import Loop
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileState
from tests.support.common import REPO, wait_for

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "jobs" / "rl_loops.py"
ONE_STEP = "1 step = AdamW.step ×1"


def _profiled(loop: str, name: str, ranks: int, one_step: str, steps: int, ray_cluster: str, client: Any, file_store: Any,
              tmp_path: Path) -> Manifest:
    """Run ``loop`` of tests/jobs/rl_loops.py as ``name``; once its ``ranks`` ranks say one step is ``one_step``,
    profile ``steps`` steps of it; stop it and answer the window's manifest."""
    log = tmp_path / f"{name}.log"
    command = [sys.executable, str(SCRIPT), "--loop", loop, "--name", name, "--address", ray_cluster,
               "--stop-file", str(tmp_path / "stop"), "--storage-path", str(tmp_path / "train")]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        def learned() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{log} exited: {log.read_text()[-3000:]}")
            found = {t.name: t for t in client.targets()}.get(name)
            return found is not None and len(found.ranks) == ranks and all(
                (r.step_definition or "").startswith(one_step) for r in found.ranks
            )

        wait_for(learned, timeout=420, what=f"the {loop} job to train and say what one step is")
        manifest = file_store.client.profile(name, steps=steps).wait(timeout=180)
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert manifest.status == ProfileState.DONE, manifest.reason
    return manifest


def test_a_grpo_jobs_report_leads_with_its_generation_and_trls_vllm_option(ray_cluster, client, file_store, tmp_path):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pyproject's dev extra pins it)")
    manifest = _profiled("grpo", "rl-grpo", 2, ONE_STEP, 3, ray_cluster, client, file_store, tmp_path)
    summary = Summary.model_validate(manifest.summary)
    assert all(len(r.steps) == 3 and r.generation is not None for r in summary.ranks)
    # The host's load (two ranks and the cluster on two cores) is told on its own; the loop's own first finding:
    found = next(f for f in summary.findings if f.code != "cores_shared")
    assert found.code == "generation" and found.ranks == [0, 1], [(f.code, f.title) for f in summary.findings]
    assert "GRPOTrainer._generate_single_turn (trl/trainer/grpo_trainer.py:" in found.evidence
    assert "use_vllm=True" in found.fix


def test_a_ppo_jobs_report_leads_with_its_rollout_and_vectorized_environments(ray_cluster, client, file_store, tmp_path):
    if importlib.util.find_spec("stable_baselines3") is None:
        pytest.skip("stable-baselines3 is not installed (pyproject's dev extra pins it)")
    manifest = _profiled("ppo", "rl-ppo", 1, "1 step = Adam.step ×1", 8, ray_cluster, client, file_store, tmp_path)
    summary = Summary.model_validate(manifest.summary)
    assert summary.loop is Loop.STABLE_BASELINES3
    (rank,) = summary.ranks
    assert rank.generation is not None and rank.generation.kind == "env"
    assert sum(ms > 0 for ms in rank.generation.ms) == 2  # 8 steps hold two whole cycles: two steps collect
    found = next(f for f in summary.findings if f.code != "cores_shared")
    assert found.code == "rollout", [(f.code, f.title) for f in summary.findings]
    assert "OnPolicyAlgorithm.collect_rollouts (stable_baselines3/common/on_policy_algorithm.py:" in found.evidence
    assert "make_vec_env(env_id, n_envs=N)" in found.fix
