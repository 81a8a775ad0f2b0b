"""Live, hook-only: an RL fine-tune rayprof did not write, and what its report says first.

TRL's ``GRPOTrainer`` (tests/jobs/rl_loops.py) generates its completions with transformers' generate inside every
training step. One step is its one optimizer's; the report names the generation first, with TRL's own option to move
it to vLLM (orchestrator/analysis/generation.py). Before that rule the same job's report led with no warning at all.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from orchestrator.models.analysis import Summary
from orchestrator.models.requests import ProfileState
from tests.support.common import REPO, wait_for

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "jobs" / "rl_loops.py"
ONE_STEP = "1 step = AdamW.step ×1"


def test_a_grpo_jobs_report_leads_with_its_generation_and_trls_vllm_option(ray_cluster, client, file_store, tmp_path):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pyproject's dev extra pins it)")
    name = "rl-grpo"
    log = tmp_path / f"{name}.log"
    command = [sys.executable, str(SCRIPT), "--loop", "grpo", "--name", name, "--address", ray_cluster,
               "--stop-file", str(tmp_path / "stop"), "--storage-path", str(tmp_path / "train")]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        def learned() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{log} exited: {log.read_text()[-3000:]}")
            found = {t.name: t for t in client.targets()}.get(name)
            return found is not None and len(found.ranks) == 2 and all(
                (r.step_definition or "").startswith(ONE_STEP) for r in found.ranks
            )

        wait_for(learned, timeout=420, what="the GRPO job to train and say what one step is")
        manifest = file_store.client.profile(name, steps=3).wait(timeout=180)
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert manifest.status == ProfileState.DONE, manifest.reason
    summary = Summary.model_validate(manifest.summary)
    assert all(len(r.steps) == 3 and r.generation is not None for r in summary.ranks)
    # The host's load (two ranks and the cluster on two cores) is told on its own; the loop's own first finding:
    found = next(f for f in summary.findings if f.code != "cores_shared")
    assert found.code == "generation" and found.ranks == [0, 1], [(f.code, f.title) for f in summary.findings]
    assert "GRPOTrainer._generate_single_turn (trl/trainer/grpo_trainer.py:" in found.evidence
    assert "use_vllm=True" in found.fix
