"""Record CPU-only traces of an RL fine-tune under TRL's GRPOTrainer (unmodified): each step generates completions with
transformers' generate, scores them and trains on them.

    PYTHONPATH=.:<trl and datasets> python tests/data/record_cpu_grpo.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities, schedule(wait=1, warmup=1,
active=3), so steps 2-4 of 5. A two-layer GPT-2 built from a config (no download) and a word-level tokenizer built in
code, 8 completions of 16 tokens a step (4 per prompt), a reward of the completion's length, one intra-op thread, a
TrainerCallback's on_step_end as the step boundary:
  trl_grpo   the agent's stack samples (every 5 ms, tests/data/sampled.py) over the recorded steps, as a rayprof window
             records them: GRPOTrainer._generate_single_turn calls generate in every step, half the step
  trl_grpo_iterations  the same with num_iterations=3: each generation's completions serve three updates, so one step
             in three generates (step 3 of the recorded 2-4)
trl 1.16.0 and datasets are no dependencies: install them beside the recorder to record (pip install --target DIR
--no-deps trl datasets dill xxhash multiprocess).
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

STEPS = 5  # wait 1 + warmup 1 + active 3: the trace is written at the fifth prof.step()


def _record(out: Path, name: str, **options: Any) -> None:
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(998)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128,
                                       bos_token_id=1, eos_token_id=1, pad_token_id=0))
    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(f"w{int(t)}" for t in torch.randint(2, 1000, (12,), generator=g)) for _ in range(64)]

    def reward_len(completions: list[str], **_: Any) -> list[float]:
        return [len(c.split()) / 16 for c in completions]

    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"

    class Step(TrainerCallback):
        def __init__(self, prof: Any) -> None:
            self.prof = prof

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.prof.step()

    args = GRPOConfig(
        output_dir=str(out / name / "run"), max_steps=STEPS, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=16, use_cpu=True, **options, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0,
    )
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        boundary = SampledSteps(prof, first=2, last=STEPS, interval_s=0.005)
        GRPOTrainer(model=model, reward_funcs=reward_len, args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
                    processing_class=tokenizer, callbacks=[Step(boundary)]).train()
    shutil.rmtree(out / name / "run", ignore_errors=True)
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


CASES = {
    "trl_grpo": lambda out: _record(out, "trl_grpo"),
    "trl_grpo_iterations": lambda out: _record(out, "trl_grpo_iterations", num_iterations=3),
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
