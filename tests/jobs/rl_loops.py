"""Reinforcement learning rayprof did not write, run hook-only under Ray Train: TRL's ``GRPOTrainer`` and
stable-baselines3's PPO, unmodified.

``python tests/jobs/rl_loops.py --loop grpo|ppo --name N --address A --stop-file F --storage-path P``

* ``grpo``: a two-layer GPT-2 built from a config and a word-level tokenizer built in code (no download), through
  Ray's ``prepare_trainer`` on 2 ranks: each step generates 8 completions of 16 tokens with transformers'
  ``generate`` (4 per prompt), scores them by their length and trains on them.
* ``ppo``: stable-baselines3's PPO on CartPole-v1 on one rank (SB3 trains one process's policy): it collects 64
  transitions from one environment, then takes 4 x 64 / 64 = 4 optimizer steps on them, so one step in 4 collects
  (a shorter cycle than the fixtures' 16 keeps a window of two cycles under the tests' trace byte cap).

The driver is ``tests/jobs/foreign_loops.py``'s (its ``main``, given this loop). Run as a script: the train function
lives in ``__main__`` and Ray pickles it by value.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import foreign_loops  # this script's own folder: foreign_loops.py beside it


def grpo_loop(config: dict) -> None:
    import ray.train.huggingface.transformers as rth
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(126)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    gpt = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=1,
                     pad_token_id=0)
    rows = torch.randint(2, 128, (4096, 8), generator=torch.Generator().manual_seed(0))
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{int(t)}" for t in row) for row in rows]})

    def length(completions: list[str], **_: object) -> list[float]:
        return [len(c.split()) / 16 for c in completions]

    class StopFile(TrainerCallback):
        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            if state.global_step % 10 == 0 and (stop.exists() or time.monotonic() > deadline):  # type: ignore[attr-defined]
                control.should_training_stop = True  # type: ignore[attr-defined]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
        max_steps=1_000_000, logging_strategy="no", save_strategy="no", report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=GPT2LMHeadModel(gpt), reward_funcs=length, args=args, train_dataset=prompts,
                          processing_class=tokenizer, callbacks=[StopFile()])
    rth.prepare_trainer(trainer).train()


def ppo_loop(config: dict) -> None:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]

    class StopFile(BaseCallback):
        def _on_step(self) -> bool:  # every environment step; the file is looked at every 256th
            return self.n_calls % 256 != 0 or not (stop.exists() or time.monotonic() > deadline)

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=4, device="cpu", seed=0)
    model.learn(total_timesteps=10_000_000, callback=StopFile())


foreign_loops.LOOPS["grpo"] = (grpo_loop, 2)
foreign_loops.LOOPS["ppo"] = (ppo_loop, 1)

if __name__ == "__main__":
    foreign_loops.main()
