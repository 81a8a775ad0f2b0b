"""Record CPU-only traces of Ray Train jobs whose steps wait in Ray's own code, with torch.profiler and the agent's
stack sampler (actors.agent.frame_sampler) as a rayprof window records them, over eight steps.

    PYTHONPATH=. python tests/data/record_ray_loops.py OUT [CASE ...]

Each case runs a TorchTrainer (Ray Train's default for the installed Ray, on a local two-CPU Ray) and lands as
``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: CPU activities only, steps 2-9 of 10, the stack samples (every 10 ms)
in the trace's metadata as the agent writes them; ``with_stack`` where the case says so.
  ray_data          one worker fed by get_dataset_shard("train").iter_torch_batches(batch_size=64) over a Dataset
                    whose map_batches spins 100 ms a batch (40 blocks): the step waits for Ray Data
  ray_data_stack    the same, with_stack=True (the wait in the trace's own Python spans)
  ray_data_fast     the same Dataset with a map_batches that does no extra work: Ray Data keeps ahead of the step
  train_report      two workers (DDP, an MLP on fixed tensors) calling ray.train.report({"loss": ...}) every step
                    (Ray Train 2, the default of Ray 2.51 on; with RAY_TRAIN_V2_ENABLED=0 in the environment, Train 1:
                    tests/data/traces/cpu_train_report_v1)
  python_weights    two workers (DDP, the same MLP) computing per-sample loss weights in a Python loop over the
                    batch's values every step, before the forward: the loop's own Python outside torch
  rank0_metrics     the same two workers, rank 0 alone computing statistics for a log line in Python after each
                    optimizer step (the rank-gated work that makes every other rank wait in the next all-reduce)
  python_tokenize   one worker reading batches of strings from a DataLoader and tokenizing them in the step with a
                    tokenizer written in Python: the data's preparation, in the step's own process
  hf_tokenize       the same with a transformers fast tokenizer (PreTrainedTokenizerFast over a WordLevel vocabulary
                    built in memory) called on each batch in the step
  ray_get           one worker setting its learning rate from ray.get(actor.lr.remote()) every step, an actor
                    that takes 20 ms to answer
Each recording takes ~20-40 s (torch 2.13.0+cpu, ray 2.60.0 when recorded).
"""

from __future__ import annotations

import gzip
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from tests.data.sampled import SampledSteps

ACTIVE = 8
STEPS = ACTIVE + 2
SAMPLE_S = 0.01


class Window:
    """torch.profiler over steps 2-9 of 10 with the agent's sampler running over the recorded steps."""

    def __init__(self, out: Path, stack: bool) -> None:
        self.folder = out / "traces"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.raw = self.folder / f"rank{train.get_context().get_world_rank()}.pt.trace.json"
        self.prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=ACTIVE),
                            with_stack=stack, on_trace_ready=lambda p: p.export_chrome_trace(str(self.raw)))
        self.steps = SampledSteps(self.prof, first=2, last=STEPS, interval_s=SAMPLE_S)
        self.prof.start()

    def step(self) -> None:
        """The agent's boundary after an optimizer step."""
        self.steps.step()

    def close(self) -> None:
        self.prof.stop()
        with self.raw.open("rb") as src, gzip.open(self.raw.with_suffix(".json.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        self.raw.unlink()


def _spin(seconds: float) -> Any:
    def prep(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:  # a CPU-bound transform
            pass
        rows = len(batch["id"])
        batch["x"] = np.random.default_rng(0).random((rows, 256), dtype=np.float32)
        batch["y"] = np.ones((rows, 1), dtype=np.float32)
        return batch

    return prep


def _fed_by_ray_data(config: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    opt = torch.optim.Adam(model.parameters())
    window = Window(Path(config["out"]), config["stack"])
    for _, batch in zip(range(STEPS), train.get_dataset_shard("train").iter_torch_batches(batch_size=64)):
        loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.step()
    window.close()


def _mlp(config: dict[str, Any], ddp: bool) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor, Window]:
    """An MLP on fixed tensors (under DDP where ``ddp``), its optimizer, and the window that records it."""
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    model = train.torch.prepare_model(model) if ddp else model
    return model, torch.optim.Adam(model.parameters()), torch.randn(64, 256), torch.randn(64, 1), Window(Path(config["out"]), False)


def _then_each_step(config: dict[str, Any], after: Callable[[torch.Tensor], object]) -> None:
    """The MLP under DDP, calling ``after`` with the loss after each step's boundary (where a loop logs)."""
    model, opt, x, y, window = _mlp(config, ddp=True)
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.step()
        after(loss)
    window.close()


def _reports_every_step(config: dict[str, Any]) -> None:
    _then_each_step(config, lambda loss: train.report({"loss": loss.item()}))


def _sample_weights(rows: list[list[float]]) -> list[float]:
    """Per-sample loss weights computed in Python, element by element: what the user's loop runs outside torch."""
    weights = []
    for row in rows:
        norm = 0.0
        for value in row:
            norm += value * value
        weights.append(1.0 / (1.0 + norm**0.5))
    return weights


def _weights_in_python(config: dict[str, Any]) -> None:
    model, opt, x, y, window = _mlp(config, ddp=True)
    rows = x.tolist() * 40
    for _ in range(STEPS):
        weights = torch.tensor(_sample_weights(rows)[:64]).unsqueeze(1)
        loss = (weights * (model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.step()
    window.close()


def _log_metrics(rows: list[list[float]]) -> float:
    """Per-sample statistics for a log line, in Python over every value: the work a loop gates on rank 0."""
    return sum(_sample_weights(rows)) / len(rows)


def _rank0_logs_in_python(config: dict[str, Any]) -> None:
    rows = torch.randn(64, 256).tolist() * 40
    _then_each_step(config, lambda _: _log_metrics(rows) if train.get_context().get_world_rank() == 0 else None)


@ray.remote
class _Schedule:
    """An actor the loop asks for its learning rate every step, as a parameter server or a shared schedule is asked."""

    def lr(self) -> float:
        time.sleep(0.02)  # the actor's own work and the round trip
        return 1e-3


def _asks_an_actor_every_step(config: dict[str, Any]) -> None:
    model, opt, x, y, window = _mlp(config, ddp=False)
    for _ in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = ray.get(config["schedule"].lr.remote())
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.step()
    window.close()


def _tokenize(texts: list[str], length: int = 32) -> torch.Tensor:
    """Word ids by hashing each word, padded: a tokenizer written in Python, called on each batch in the step."""
    ids = [[sum(ord(c) * 31**i for i, c in enumerate(word)) % 5000 for word in text.split()][:length] for text in texts]
    return torch.tensor([row + [0] * (length - len(row)) for row in ids])


def _hf_tokenizer(words: list[str]) -> Any:
    """A transformers fast tokenizer over ``words`` (a tokenizers WordLevel model built in memory: no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")


def _tokenizes_in_the_step(config: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    words = [f"w{i}x{i * 7 % 13}" for i in range(4000)]
    texts = [" ".join(words[(j * 13 + k) % 4000] for k in range(128 if config["hf"] else 32)) for j in range(64 * STEPS)]
    loader = torch.utils.data.DataLoader(texts, batch_size=64)  # a list of strings a batch
    model = nn.Sequential(nn.EmbeddingBag(5000, 64), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters())
    tokenizer = _hf_tokenizer(words) if config["hf"] else None
    window = Window(Path(config["out"]), False)
    for texts_batch in loader:
        if tokenizer is not None:
            ids = tokenizer(list(texts_batch), padding=True, truncation=True, max_length=128, return_tensors="pt")["input_ids"] % 5000
        else:
            ids = _tokenize(list(texts_batch) * 6)[:64]
        loss = model(ids).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.step()
    window.close()


def record(out: Path, case: str) -> None:
    folder = (out / case).resolve()
    shutil.rmtree(folder, ignore_errors=True)
    config: dict[str, Any] = {"out": str(folder), "stack": case == "ray_data_stack", "hf": case == "hf_tokenize"}
    if case.startswith("ray_data"):
        spin = 0.0 if case == "ray_data_fast" else 0.1
        ds = ray.data.range(64 * 40, override_num_blocks=40).map_batches(_spin(spin), batch_size=64)
        trainer = TorchTrainer(_fed_by_ray_data, train_loop_config=config, datasets={"train": ds},
                               scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(storage_path="/tmp/rayprof-rec"))
    elif case == "train_report":
        trainer = TorchTrainer(_reports_every_step, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(storage_path="/tmp/rayprof-rec"))
    elif case in ("python_weights", "rank0_metrics", "python_tokenize", "hf_tokenize"):
        loop = {"python_weights": _weights_in_python, "rank0_metrics": _rank0_logs_in_python}.get(case, _tokenizes_in_the_step)
        workers = 2 if case in ("python_weights", "rank0_metrics") else 1
        trainer = TorchTrainer(loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=workers),
                               run_config=RunConfig(storage_path="/tmp/rayprof-rec"))
    elif case == "ray_get":
        config["schedule"] = _Schedule.remote()
        trainer = TorchTrainer(_asks_an_actor_every_step, train_loop_config=config, scaling_config=ScalingConfig(num_workers=1),
                               run_config=RunConfig(storage_path="/tmp/rayprof-rec"))
    else:
        raise SystemExit(f"unknown case {case!r}")
    trainer.fit()


CASES = ("ray_data", "ray_data_stack", "ray_data_fast", "train_report", "python_weights", "rank0_metrics", "python_tokenize",
         "hf_tokenize", "ray_get")

if __name__ == "__main__":
    target = Path(sys.argv[1])
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    for name in sys.argv[2:] or CASES:
        record(target, name)
