"""What the device check trains and how it drives the agent: two small models, a DataLoader-bound loop, a Python-bound
one, one left under autograd's anomaly detection, one keeping a weights' average one tensor at a time, and
:class:`Driver`, the real agent armed and read as the controller would, minus Ray (benchmarks/gpu.py)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "WINDOW_STEPS", "AnomalyLoop", "Driver", "EmaLoop", "GenerationLoop", "Loop", "SmallCNN", "SmallTransformer", "loops",
]

WINDOW_STEPS = 3


class SmallCNN(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        chans = [3, width, width * 2, width * 4]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans, chans[1:]))
        self.norms = nn.ModuleList(nn.BatchNorm2d(b) for b in chans[1:])
        self.head = nn.Linear(chans[-1], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms):
            x = F.max_pool2d(F.relu(norm(conv(x))), 2)
        return self.head(x.mean((2, 3)))


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=dim * 4, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


class Loop:
    """A model, its optimizer and where each step's batch comes from."""

    def __init__(self, name: str, model: nn.Module, batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 device: torch.device) -> None:
        self.name, self.model, self.batch, self.device = name, model.to(device), batch, device
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self) -> None:
        x, y = self.batch()
        out = self.model(x.to(self.device, non_blocking=True))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.to(self.device, non_blocking=True).reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


class AnomalyLoop(Loop):
    """A loop left under autograd's anomaly detection, a debugging aid: the engine checks every backward node's
    outputs for NaN (on a GPU, each check waits for the queued kernels) and forward formats a traceback per op."""

    def step(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled...", on every entry
            with torch.autograd.detect_anomaly():
                super().step()


class EmaLoop(Loop):
    """A transformer fed by a DataLoader that keeps an average of its weights through torch's ``AveragedModel`` given an
    ``avg_fn``, which updates one tensor at a time (on a GPU, a few kernel launches per tensor): told ``param_loop``."""

    def __init__(self, name: str, model: nn.Module, ids: torch.Tensor, device: torch.device) -> None:
        from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

        super().__init__(name, model, self._batches(ids), device)
        self.average = AveragedModel(self.model, avg_fn=get_ema_avg_fn(0.999))

    @staticmethod
    def _batches(ids: torch.Tensor) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, ids), batch_size=len(ids))

        def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            while True:  # one batch an epoch: each step's fetch is a DataLoader next(), as a real loop's
                yield from loader

        batches = forever()
        return lambda: next(batches)

    def step(self) -> None:
        super().step()
        self.average.update_parameters(self.model)


class GenerationLoop(Loop):
    """An RL fine-tune's step as TRL's GRPOTrainer takes it, without TRL: transformers' ``generate`` samples 16 tokens
    for each of 8 prompts (no gradients), then the policy trains on prompts and completions; told ``generation``.
    A GPT-2 built from a config (no download): transformers is on the device machine's image, not rayprof's."""

    TOKENS = 16

    def __init__(self, device: torch.device, quick: bool) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=2 if quick else 4, n_embd=64 if quick else 256, n_head=4, vocab_size=1000,
                            n_positions=128, bos_token_id=1, eos_token_id=1, pad_token_id=0)
        prompts = torch.randint(2, 1000, (8, 16), device=device)
        super().__init__("generation", GPT2LMHeadModel(config), lambda: (prompts, prompts), device)

    def step(self) -> None:
        prompts, _ = self.batch()
        with torch.no_grad():
            seqs = self.model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                                       max_new_tokens=self.TOKENS, min_new_tokens=self.TOKENS)
        loss = self.model(seqs, labels=seqs).loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def loops(device: torch.device, quick: bool) -> dict[str, Loop]:
    side, batch, seq = (32, 8, 32) if quick else (64, 64, 128)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    ids = torch.randint(0, 1000, (batch // 2, seq), device=device)
    # --quick (the CPU rehearsal in the unit tests) makes the transform 8x dearer: at 2x the loader took 29% of a
    # CPU step, at 4x 48% alone and 25-58% with three more runs beside it (CI's unit tests run two at once),
    # at the 25% bar; at 8x it leads with a margin no load closes.
    loader = _slow_loader(batch, side, scale=8 if quick else 2)
    return {
        "cnn": Loop("cnn", SmallCNN(16 if quick else 64), lambda: (images, labels), device),
        "transformer": Loop("transformer", SmallTransformer(dim=64 if quick else 256), lambda: (ids, ids), device),
        # The same CNN fed by a DataLoader whose per-sample transform runs on the training thread.
        "dataloader_bound": Loop("dataloader_bound", SmallCNN(16 if quick else 64), lambda: next(loader), device),
        # The same CNN with a Python loop over a million values on the training thread before each step (~30 ms).
        "python_bound": Loop("python_bound", SmallCNN(16 if quick else 64), _after_python((images, labels)), device),
        "anomaly": AnomalyLoop("anomaly", SmallCNN(16 if quick else 64), lambda: (images, labels), device),
        # 16 layers (195 tensors): the average's loop lasts long enough in three steps for the agent's stack samples
        # (every 5 ms) to name its owner in every run; with 4 (51 tensors, 2-4 ms a step on a CPU) 3 runs in 16 had
        # none, and an unnamed loop is not told.
        "ema": EmaLoop("ema", SmallTransformer(dim=64 if quick else 256, layers=16), ids.cpu(), device),
        # Where transformers is installed (the device machine's image has it): generation inside the step.
        **({"generation": GenerationLoop(device, quick)} if importlib.util.find_spec("transformers") else {}),
    }


def _score_labels(rows: list[list[float]]) -> float:
    """A per-value Python loop, no torch op in it: what only the agent's stack samples can name."""
    total = 0.0
    for row in rows:
        for value in row:
            total += value * value
    return total


def _after_python(batch: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    rows = torch.rand(1024, 1024).tolist()

    def fetch() -> tuple[torch.Tensor, torch.Tensor]:
        _score_labels(rows)
        return batch

    return fetch


class _CostlyImages(torch.utils.data.Dataset):
    """Images made by a costly per-sample transform on the CPU (a blur of a ``scale`` x larger image)."""

    def __init__(self, side: int, scale: int) -> None:
        self.side, self.scale = side, scale

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(i)
        img = torch.randn(1, 3, self.side * self.scale, self.side * self.scale, generator=gen)
        return F.avg_pool2d(F.conv2d(img, torch.ones(3, 3, 5, 5) / 75, padding=2), self.scale)[0], i % 10


def _slow_loader(batch: int, side: int, scale: int):
    """A DataLoader as a tutorial's first version has it: the transform on the training thread (num_workers=0)."""
    loader = torch.utils.data.DataLoader(_CostlyImages(side, scale), batch_size=batch, num_workers=0)
    return iter(loader)


class Driver:
    """The real agent, armed and read as the controller would, minus Ray."""

    def __init__(self, store: Path, device: torch.device) -> None:
        from actors.agent.runtime import Agent
        from orchestrator.models.agent_protocol import WorkerInfo

        self.store, self.device = store, device
        self.agent = Agent(WorkerInfo(
            agent_id="gpu-check", target="gpu", world_rank=0, world_size=1, local_rank=0, node_rank=0,
            node_id="n", host=platform.node() or "host", pid=os.getpid(), device=str(device),
            torch_version=torch.__version__,
        ))
        self.boundary_ms: list[float] = []
        self.activities = ["cpu", "cuda"] if device.type == "cuda" else ["cpu"]
        # Reading a trace back (json.load of up to 35 MB in this process) is the check's own work, not the agent's:
        # the lasting-cost probe (benchmarks/gpu_lasting.py) measures windows with it and without.
        self.read_traces = True

    def train(self, loop: Loop, steps: int) -> list[float]:
        """``steps`` steps, each ended by the agent's boundary; returns each step's ms (synchronized)."""
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loop.step()
            b0 = time.perf_counter()
            self.agent.step()
            self.boundary_ms.append((time.perf_counter() - b0) * 1000)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        return times

    def window(self, loop: Loop, profile_id: str, **options: Any) -> dict[str, Any]:
        """Arm one window 2 steps ahead, train through it and its upload; the rank's last event and trace facts."""
        from orchestrator.models.agent_protocol import ArmCommand, StorageSpec, WindowSpec
        from orchestrator.models.requests import TorchOptions

        activities = self.activities
        start = self.agent.step_count + 2
        window = WindowSpec(
            profile_id=profile_id, target="gpu", start_step=start, steps=WINDOW_STEPS, warmup=0,
            options=TorchOptions(activities=activities, **options),
            storage=StorageSpec(uri=str(self.store)), prefix=f"gpu/{profile_id}", max_trace_bytes=2**30,
        )
        self.agent._handle(ArmCommand(window=window))
        capture = self.agent.capture
        assert capture is not None
        self.boundary_ms = []
        for _ in range(WINDOW_STEPS + 10):
            if capture.closed:
                break
            self.train(loop, 1)
        if capture.finisher is not None:
            capture.finisher.join(300)
        events = []
        while not self.agent._inbox.empty():
            events.append(self.agent._inbox.get_nowait()[1])
        last = events[-1]
        facts: dict[str, Any] = {
            "state": last.state.value, "reason": last.reason, "first_step": last.first_step,
            "last_step": last.last_step, "expected_steps": [start, start + WINDOW_STEPS - 1],
            "trace_bytes": last.trace_bytes, "closing_boundary_ms": max(self.boundary_ms, default=0.0),
            "artifacts": {a.kind: a.bytes for a in last.artifacts},
        }
        trace = self.store / "gpu" / profile_id / next((a.key for a in last.artifacts if a.kind == "trace"), "-")
        if trace.is_file() and self.read_traces:
            with gzip.open(trace, "rt") as f:
                evs = json.load(f).get("traceEvents", [])
            facts["kernels"] = sum(1 for e in evs if e.get("cat") == "kernel")
            # torch.compile's compiler at work (what the analysis reads as `compile`, spans.compilations).
            facts["compile_spans"] = sum(1 for e in evs if str(e.get("name", "")).endswith(" (dynamo_timed)"))
            # The CPU span only: with CUDA activities each step is also a gpu_user_annotation of the same name.
            facts["profiler_steps"] = sorted(
                int(e["name"].split("#")[1]) for e in evs
                if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
            )
        return facts
