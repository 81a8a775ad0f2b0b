"""Record CPU-only traces of stable-baselines3's PPO (unmodified) on CartPole-v1: reinforcement learning whose
rollouts step environments inside the training loop.

    PYTHONPATH=.:<stable-baselines3 and gymnasium> python tests/data/record_cpu_sb3.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities, one intra-op thread, the step
boundary a step post-hook on the policy's optimizer (the agent counts optimizer steps), wrapped by SampledSteps
(stack samples every 5 ms, as a rayprof window records them), and whose loop it is as the agent reads it.
PPO(batch_size=64, n_epochs=4) collects 256 transitions a rollout, then takes 4 x 256 / 64 = 16 optimizer steps on
them: step 16 of the recorded 16-31 (one whole cycle) is the one that collects.
  cpu_sb3_ppo       one environment, n_steps=256: the collecting step 211 ms, the 15 updates 4.7-12.4 ms
                    (unprofiled: collect_rollouts 72% of the time, the policy's forward of one observation 50%)
  cpu_sb3_ppo_vec4  make_vec_env(n_envs=4) (a DummyVecEnv), n_steps=64: the same 256 transitions and cycle, the
                    policy run once for four environments (unprofiled: a cycle 2.1x faster, collecting 45% of it)
stable-baselines3 2.9.2 is no dependency: install it beside the recorder to record (pip install --target DIR
--no-deps stable-baselines3==2.9.2 gymnasium cloudpickle farama-notifications).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sampled import SampledSteps  # noqa: E402


def _record(out: Path, name: str, wait: int, warmup: int, active: int, n_envs: int = 1, n_steps: int = 256) -> None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from orchestrator.loops import METADATA_KEY, loop_of_stack

    torch.manual_seed(0)
    torch.set_num_threads(1)
    env: Any = "CartPole-v1" if n_envs == 1 else make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=64, n_epochs=4, device="cpu", seed=0)
    per_rollout = n_steps * n_envs
    opt_steps_per_rollout = 4 * per_rollout // 64
    last = wait + warmup + active
    rollouts = -(-last // opt_steps_per_rollout)  # enough rollouts for `last` optimizer steps
    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        steps = SampledSteps(prof, first=wait + warmup, last=last, interval_s=0.005)

        def boundary(*_: Any) -> None:  # the agent's step boundary, and whose loop it is once the profiler records
            if steps.calls < last:
                steps.step()
            if steps.calls == wait + warmup:
                prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))

        model.policy.optimizer.register_step_post_hook(boundary)
        model.learn(total_timesteps=rollouts * per_rollout)
    assert steps.calls == last, steps.calls
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


CASES = {
    "cpu_sb3_ppo": lambda out: _record(out, "cpu_sb3_ppo", 14, 2, 16),
    "cpu_sb3_ppo_vec4": lambda out: _record(out, "cpu_sb3_ppo_vec4", 14, 2, 16, n_envs=4, n_steps=64),
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
