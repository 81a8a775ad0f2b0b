"""Record CPU-only traces of training code rayprof did not write (issue 29), with plain torch.profiler.

    PYTHONPATH=. python tests/data/record_cpu_issue29.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz`` (the layout ``rayprof analyze`` reads): CPU
activities only, schedule(wait=1, warmup=1, active=3), record_shapes=True, with_stack=False (True for
hf_trainer_stacks and lightning_prog_bar), so steps 2-4 of 5.
  hf_trainer   healthy: a Hugging Face Trainer on a tiny GPT-2 built from a config, synthetic token ids in memory;
               a TrainerCallback calls prof.step() at on_step_end
  hf_trainer_stacks  the same with with_stack=True: the Python functions that read values back are named
  hf_trainer_accumulate  the same with gradient_accumulation_steps=2: two forward and backward passes a step, the
               second forward between the two backward passes, no marker on either
  hf_trainer_save  the same with save_steps=3: the Trainer saves a checkpoint after the third step, before the
               fourth fetches its batch (the middle step of the window)
  hf_trainer_logging  the same with logging_steps=1: it reads the loss and the gradient norm back every step
  hf_trainer_checkpointing  the same with gradient_checkpointing=True and with_stack=True: each GPT2Block's forward
               runs again inside backward, its nn.Module spans there too
  mlp          healthy: a plain MLP loop over in-memory tensors
  data_bound   the same loop fed by DataLoader(num_workers=0) whose __getitem__ does heavy numpy work per sample
  optimizer    2,000 tiny Linear layers stepped by Adam(foreach=False): one small op chain per parameter (9 MB)
  optimizer_small  the same with 40 layers (80 parameters), small enough to commit as a test fixture
  round_trip   a loop that reads .item() and .cpu().numpy() inside record_function("HOST ROUND TRIP") each step
  lightning    a Lightning Trainer (CPU, no logger, no progress bar); a Callback calls prof.step() per batch
  lightning_prog_bar  the same logging its loss with self.log(..., prog_bar=True), with_stack=True
  lightning_validate  the same validating on two batches and saving a checkpoint after the third step
               (val_check_interval=3, ModelCheckpoint(every_n_train_steps=3)): before the fourth fetches its batch
  hf_trainer_save_sampled, lightning_validate_sampled  hf_trainer_save and lightning_validate with the agent's stack
               samples (every 5 ms, tests/data/sampled.py) in the trace, as a rayprof window records them
  grad_scaler  the MLP under autocast with a torch.amp.GradScaler, unscale_ and clip_grad_norm_, AdamW (foreach)
  grad_scaler_fused  the same with AdamW(fused=True)
  fsdp2        two gloo ranks (torch.multiprocessing), an MLP of 6 blocks under FSDP2: fully_shard per block, then
               the root; rank0/rank1.pt.trace.json.gz
  fsdp2_one_unit  the same model with fully_shard on the root only: one unit, nothing for its all-gather to overlap
  ddp          two gloo ranks, an MLP under DDP (its bucket all-reduce runs inside backward's AccumulateGrad node)
  ddp_metrics  the same reducing the loss and 20 one-element metrics with dist.all_reduce each step, one call each
  ddp_find_unused  the ddp loop with find_unused_parameters=True (a transformers Trainer's default): after backward
               DDP reads its CPU map of used parameters once per parameter, before copying its gradient out
  lightning_ddp  a Lightning Trainer under DDP on two gloo ranks, prof.step() called where rayprof's agent calls it (a
               global optimizer step post-hook, inside the Optimizer.step#Adam.step annotation): each step starts
               inside the last one's optimizer step, and the closure waits there for gloo's all-reduce
Each recording takes seconds (torch 2.13.0+cpu, transformers 5.24.0, lightning 2.6.6 when recorded).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS
from tests.data.sampled import SampledSteps

STEPS = 5  # wait 1 + warmup 1 + active 3: the trace is written at the fifth prof.step()
SAMPLE_S = DEFAULT_FRAME_SAMPLE_MS / 1000  # the agent's stack sampling, in the *_sampled cases


@contextmanager
def recording(out: Path, name: str, rank: int = 0, with_stack: bool = False, sample_s: float | None = None) -> Iterator[Any]:
    """The profiler to call step() on; with ``sample_s``, the agent's stack sampler runs over the recorded steps."""
    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"rank{rank}.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 record_shapes=True, with_stack=with_stack,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        yield SampledSteps(prof, first=2, last=STEPS, interval_s=sample_s) if sample_s else prof
    with raw.open("rb") as src, gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def loop(out: Path, name: str, step: Callable[[], None]) -> None:
    with recording(out, name) as prof:
        for _ in range(STEPS):
            step()
            prof.step()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def case_mlp(out: Path) -> None:
    net = mlp()
    opt = torch.optim.Adam(net.parameters())
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))

    def step() -> None:
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    loop(out, "mlp", step)


class HeavyDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Per-sample host work in __getitem__ (an FFT-based 'augmentation' in numpy), as a decoding pipeline would do."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng(i)
        img = rng.standard_normal((64, 64))
        for _ in range(4):
            img = np.abs(np.fft.ifft2(np.fft.fft2(img) * 0.5))
        feats = np.resize(img.astype(np.float32).ravel(), 256)
        return torch.from_numpy(feats), torch.tensor(i % 10)


def case_data_bound(out: Path) -> None:
    net = mlp()
    opt = torch.optim.Adam(net.parameters())
    batches = iter(torch.utils.data.DataLoader(HeavyDataset(), batch_size=256, num_workers=0))

    def step() -> None:
        x, y = next(batches)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    loop(out, "data_bound", step)


class ManyLayers(nn.Module):
    def __init__(self, n: int = 2000) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([layer(x) for layer in self.layers]).sum(0)


def case_optimizer(out: Path, layers: int = 2000, name: str = "optimizer") -> None:
    net = ManyLayers(layers)
    opt = torch.optim.Adam(net.parameters(), foreach=False)  # one chain of small ops per parameter
    x = torch.randn(8, 4)

    def step() -> None:
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    loop(out, name, step)


def case_round_trip(out: Path) -> None:
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))

    def step() -> None:
        logits = net(x)
        loss = nn.functional.cross_entropy(logits, y)
        with record_function("HOST ROUND TRIP"):
            threshold = logits.mean().item()
            picked = np.argwhere(logits.detach().cpu().numpy() > threshold)
            weight = torch.from_numpy(picked).float().mean()
        (loss + 0 * weight).backward()
        opt.step()
        opt.zero_grad()

    loop(out, "round_trip", step)


def case_grad_scaler(out: Path, name: str, fused: bool) -> None:
    """Mixed precision with a loss scaler, as fp16 training on a GPU runs it (torch.amp on the CPU here)."""
    net = mlp()
    opt = torch.optim.AdamW(net.parameters(), fused=True) if fused else torch.optim.AdamW(net.parameters())
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    loop(out, name, step)


def case_hf_trainer(
    out: Path, name: str = "hf_trainer", with_stack: bool = False, sample_s: float | None = None, **arguments: Any
) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 1000, (64, 32))
    rows = [{"input_ids": r, "labels": r} for r in ids]

    class Step(TrainerCallback):
        def __init__(self, prof: Any) -> None:
            self.prof = prof

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.prof.step()

    args = TrainingArguments(**{
        "output_dir": str(out / name / "run"), "max_steps": STEPS, "per_device_train_batch_size": 8, "use_cpu": True,
        "report_to": "none", "save_strategy": "no", "logging_strategy": "no", "disable_tqdm": True,
        "dataloader_num_workers": 0, **arguments,
    })
    with recording(out, name, with_stack=with_stack, sample_s=sample_s) as prof:
        Trainer(model=model, args=args, train_dataset=rows, callbacks=[Step(prof)]).train()
    shutil.rmtree(out / name / "run", ignore_errors=True)


def lightning_parts(prog_bar: bool = False, sync_dist: bool = False) -> tuple[Any, Any]:
    """A LightningModule over mlp() (logging its loss to the progress bar when ``prog_bar``; with ``sync_dist``, its
    loss and three metrics with self.log(..., sync_dist=True), reduced across the ranks every step) and the class of a
    Callback that calls prof.step() at the end of each training batch."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            x, y = batch
            logits = self.net(x)
            loss = nn.functional.cross_entropy(logits, y)
            if prog_bar:
                self.log("loss", loss, prog_bar=True)
            if sync_dist:
                self.log("loss", loss, sync_dist=True)
                self.log("accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=True)
                self.log("logit_norm", logits.norm(), sync_dist=True)
                self.log("confidence", logits.softmax(1).amax(1).mean(), sync_dist=True)
            return loss

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters())

    class Step(L.Callback):
        def __init__(self, prof: Any) -> None:
            self.prof = prof

        def on_train_batch_end(self, *_: Any, **__: Any) -> None:
            self.prof.step()

    return Module(), Step


def case_lightning(
    out: Path, name: str = "lightning", prog_bar: bool = False, validate: bool = False, sample_s: float | None = None
) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    module, Step = lightning_parts(prog_bar)

    data = torch.utils.data.TensorDataset(torch.randn(256 * STEPS, 256), torch.randint(0, 10, (256 * STEPS,)))
    held_out = torch.utils.data.TensorDataset(torch.randn(128, 256), torch.randint(0, 10, (128,)))
    # Validation and a checkpoint after the third step (val_check_interval, every_n_train_steps).
    between = dict(val_check_interval=3, num_sanity_val_steps=0) if validate else dict(enable_checkpointing=False)
    saving = [ModelCheckpoint(dirpath=str(out / name / "ckpt"), every_n_train_steps=3)] if validate else []
    with recording(out, name, with_stack=prog_bar, sample_s=sample_s) as prof:
        L.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
            enable_model_summary=False, callbacks=[Step(prof), *saving], **between,  # type: ignore[arg-type]
        ).fit(
            module, torch.utils.data.DataLoader(data, batch_size=256),
            torch.utils.data.DataLoader(held_out, batch_size=64) if validate else None,
        )
    shutil.rmtree(out / name / "ckpt", ignore_errors=True)


def _fsdp2_rank(rank: int, out: Path, name: str, per_block: bool, port: int) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = six_blocks()
    if per_block:
        for block in net[:-1]:
            fully_shard(block)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def six_blocks() -> nn.Module:
    """Six Linear+ReLU blocks and a head: the model the FSDP2 and ZeroRedundancyOptimizer recordings shard."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(6)], nn.Linear(512, 10))


def _two_ranks(rank_main: Callable[..., None], *args: Any) -> None:
    """``rank_main(rank, *args, port)`` in two processes that meet at a free local port."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(*args, port), nprocs=2)


def case_fsdp2(out: Path, name: str = "fsdp2", per_block: bool = True) -> None:
    _two_ranks(_fsdp2_rank, out, name, per_block)


def _ddp_rank(rank: int, out: Path, name: str, metrics: int, find_unused: bool, port: int) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)), find_unused_parameters=find_unused
    )
    opt = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if metrics:
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                for _ in range(metrics):
                    dist.all_reduce(torch.tensor([float(rank)]))
            prof.step()
    dist.destroy_process_group()


def case_ddp(out: Path, name: str = "ddp", metrics: int = 0, find_unused: bool = False) -> None:
    _two_ranks(_ddp_rank, out, name, metrics, find_unused)


def lightning_rank_env(rank: int, port: int) -> None:
    """Rank ``rank`` of two, set as a launcher outside Lightning sets them (Ray Train's RayDDPStrategy): Lightning
    starts no processes."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                      NODE_RANK="0")


def fit_on_two_ranks(module: Any, data: Any, batch_size: int, steps: int, boundary: Callable[..., None], **trainer: Any) -> None:
    """Fit ``module`` on ``data`` under Lightning's DDP on this gloo rank of two for ``steps`` steps, ``boundary`` called
    where rayprof's agent puts the step boundary: a global optimizer step post-hook, which torch runs inside the
    Optimizer.step#... annotation (Lightning calls optimizer.step(closure))."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    hook = register_optimizer_step_post_hook(boundary)
    try:
        L.Trainer(
            max_steps=steps, accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
            enable_progress_bar=False, logger=False, enable_model_summary=False, enable_checkpointing=False, **trainer,
        ).fit(module, torch.utils.data.DataLoader(data, batch_size=batch_size))
    finally:
        hook.remove()


def _lightning_ddp_rank(rank: int, out: Path, name: str, port: int) -> None:
    lightning_rank_env(rank, port)
    torch.manual_seed(0)
    module, _ = lightning_parts()
    data = torch.utils.data.TensorDataset(torch.randn(2 * 256 * STEPS, 256), torch.randint(0, 10, (2 * 256 * STEPS,)))
    with recording(out, name, rank) as prof:
        fit_on_two_ranks(module, data, 256, STEPS, lambda *_: prof.step())


def case_lightning_ddp(out: Path, name: str = "lightning_ddp") -> None:
    _two_ranks(_lightning_ddp_rank, out, name)


CASES: dict[str, Callable[[Path], None]] = {
    "hf_trainer": case_hf_trainer, "hf_trainer_stacks": lambda out: case_hf_trainer(out, "hf_trainer_stacks", with_stack=True),
    "hf_trainer_accumulate": lambda out: case_hf_trainer(out, "hf_trainer_accumulate", gradient_accumulation_steps=2),
    "hf_trainer_save": lambda out: case_hf_trainer(out, "hf_trainer_save", save_strategy="steps", save_steps=3),
    "hf_trainer_logging": lambda out: case_hf_trainer(out, "hf_trainer_logging", logging_strategy="steps", logging_steps=1),
    "hf_trainer_checkpointing": lambda out: case_hf_trainer(
        out, "hf_trainer_checkpointing", with_stack=True, gradient_checkpointing=True
    ),
    "mlp": case_mlp, "data_bound": case_data_bound, "optimizer": case_optimizer,
    "optimizer_small": lambda out: case_optimizer(out, 40, "optimizer_small"),
    "round_trip": case_round_trip, "lightning": case_lightning,
    "grad_scaler": lambda out: case_grad_scaler(out, "grad_scaler", fused=False),
    "grad_scaler_fused": lambda out: case_grad_scaler(out, "grad_scaler_fused", fused=True),
    "lightning_prog_bar": lambda out: case_lightning(out, "lightning_prog_bar", prog_bar=True),
    "lightning_validate": lambda out: case_lightning(out, "lightning_validate", validate=True),
    "hf_trainer_save_sampled": lambda out: case_hf_trainer(
        out, "hf_trainer_save_sampled", sample_s=SAMPLE_S, save_strategy="steps", save_steps=3
    ),
    "lightning_validate_sampled": lambda out: case_lightning(out, "lightning_validate_sampled", validate=True, sample_s=SAMPLE_S),
    "fsdp2": case_fsdp2, "fsdp2_one_unit": lambda out: case_fsdp2(out, "fsdp2_one_unit", per_block=False),
    "ddp": case_ddp, "ddp_metrics": lambda out: case_ddp(out, "ddp_metrics", metrics=20),
    "ddp_find_unused": lambda out: case_ddp(out, "ddp_find_unused", find_unused=True), "lightning_ddp": case_lightning_ddp,
}


if __name__ == "__main__":
    torch.manual_seed(0)
    target = Path(sys.argv[1])
    for name in sys.argv[2:] or list(CASES):
        CASES[name](target)
        print("recorded", target / name, flush=True)
