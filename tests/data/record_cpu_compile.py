"""Record CPU-only traces of transformers' Trainer with ``torch_compile=True`` (unmodified) whose batches change their
sequence length every step (padded to the batch's longest): torch.compile compiling inside the training steps.

    PYTHONPATH=. python tests/data/record_cpu_compile.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities, schedule(wait=W, warmup=1, active=3,
repeat=1), the agent's stack samples (every 5 ms, tests/data/sampled.py) and whose loop it is, as a rayprof window
records them; a two-layer GPT-2 (n_embd 64) built from a config, a word-level tokenizer built in code, batches of 4
in order, each batch's longest text a length of its own in 8..120 words, Inductor on the CPU, one intra-op thread.
Each case in a process of its own with an empty TORCHINDUCTOR_CACHE_DIR (a warm cache shortens a compile).
  cpu_compile_warmup      wait=0: the window holds step 1, where Dynamo recompiles for the second length and marks
                          the dimension dynamic (automatic dynamic shapes); steps 2 and 3 run the compiled code.
                          Unprofiled (TORCH_LOGS=recompiles): step 0 38.4 s, step 1 28.9 s (5 frames recompiled),
                          steps 2-7 5.7-23.8 ms
  cpu_compile_recompiles  torch._dynamo.config.automatic_dynamic_shapes=False (what torch.compile(dynamic=False) sets),
                          wait=1: every new length recompiles (5 frames, 4 Inductor cache misses a step), 20-23 s a
                          step against 10-20 ms eager
  cpu_compile_warmup_contended  cpu_compile_warmup again, recorded while the unit tests ran beside it on the same
                          two cores: the training thread off a CPU 66% of each step, most of it in the compile
Recording takes 1-3 minutes a case on two cores.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

A = 3
BATCH = 4

CASES: dict[str, dict[str, Any]] = {
    "cpu_compile_warmup": {"w": 0},
    "cpu_compile_recompiles": {"w": 1, "static": True},
}


def build(run_dir: Path, callbacks: list[Any], steps: int, static: bool = False) -> Any:
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        DataCollatorForLanguageModeling,
        GPT2Config,
        GPT2LMHeadModel,
        PreTrainedTokenizerFast,
        Trainer,
        TrainingArguments,
    )

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if static:
        torch._dynamo.config.automatic_dynamic_shapes = False
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(998)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        model_max_length=256)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=256,
                                       bos_token_id=1, eos_token_id=1, pad_token_id=0))
    g = torch.Generator().manual_seed(0)
    # batch i's longest text is a distinct length in 8..120 (sequential sampler), the others shorter
    n_batches = steps + 2
    longest = (torch.randperm(113, generator=g)[:n_batches] + 8).tolist()
    texts = []
    for top in longest:
        lens = [top] + torch.randint(8, top + 1, (BATCH - 1,), generator=g).tolist()
        for n in lens:
            texts.append(" ".join(f"w{int(t)}" for t in torch.randint(2, 1000, (n,), generator=g)))
    data = Dataset.from_dict({"text": texts}).map(lambda b: tokenizer(b["text"]), batched=True,
                                                  remove_columns=["text"])
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    args = TrainingArguments(
        output_dir=str(run_dir), max_steps=steps, per_device_train_batch_size=BATCH, use_cpu=True,
        torch_compile=True, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, train_sampling_strategy="sequential", seed=0)
    return Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=callbacks)


def record(out: Path, name: str, w: int, a: int = A, **opts: Any) -> None:
    from sampled import SampledSteps
    from transformers import TrainerCallback

    from orchestrator.loops import METADATA_KEY, loop_of_stack

    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"
    run_dir = Path(tempfile.mkdtemp(prefix="rec-compile-"))

    class Step(TrainerCallback):
        def __init__(self, prof: Any) -> None:
            self.prof = prof

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.prof.step()
            if self.prof.calls == w + 1:  # as the agent does once the window records
                prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=w, warmup=1, active=a, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        boundary = SampledSteps(prof, first=w + 1, last=w + 1 + a, interval_s=0.005)
        t0 = time.perf_counter()
        build(run_dir, callbacks=[Step(boundary)], steps=w + a + 2, **opts).train()
        print(f"{name}: wait={w} active={a}, trained {w + a + 2} steps in {time.perf_counter() - t0:.1f}s", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


if __name__ == "__main__":
    target, cases = Path(sys.argv[1]), sys.argv[2:] or list(CASES)
    if len(cases) == 1:
        record(target, cases[0], **CASES[cases[0]])
    else:  # a process of its own per case, with an empty Inductor cache, as the recorded fixtures were
        for case in cases:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
            subprocess.run([sys.executable, __file__, str(target), case], env=env, check=True)
