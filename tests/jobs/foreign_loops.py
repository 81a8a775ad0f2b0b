"""Training loops rayprof did not write, run hook-only (the setup hook; no rayprof import in the loop).

``python tests/jobs/foreign_loops.py --loop gan|compiled|fsdp2|lightning|lightning_gan|hf|hf_checkpointing|accelerate|ray_data|keras|deepspeed --name N --address A --stop-file F --storage-path P``

* ``gan``: a generator (Adam) and a discriminator (SGD) stepped once each per
  iteration, the DCGAN example's order (D first), both DDP-wrapped.
* ``compiled``: a ``torch.compile``d MLP (``aot_eager``: dynamo and AOTAutograd,
  so backward runs as ``CompiledFunctionBackward``, without inductor's C++ build).
* ``fsdp2``: an MLP of four blocks under FSDP2 (``fully_shard`` per block, then the root; 2 ranks on
  Ray Train's gloo group): parameters all-gathered per block in forward and again in backward,
  gradients reduce-scattered.
* ``lightning``: a LightningModule under Ray's ``RayDDPStrategy`` (2 ranks):
  Lightning calls ``optimizer.step(closure)``, forward and backward run inside it; it logs its loss with
  ``self.log(..., sync_dist=True)``.
* ``lightning_gan``: a GAN as a LightningModule with manual optimization (``automatic_optimization = False``,
  ``manual_backward``, the discriminator's SGD then the generator's Adam stepped through Lightning's optimizer
  wrappers), under ``RayDDPStrategy(find_unused_parameters=True)`` (2 ranks: each backward leaves one model's
  parameters unused, as Lightning's error says a GAN needs).
* ``hf``: Hugging Face ``Trainer`` (through Ray's ``prepare_trainer``, 2 ranks) on a tiny
  GPT-2 built from a config, synthetic token ids (no download), gradient accumulation 2.
* ``hf_checkpointing``: the same with ``gradient_checkpointing=True``: backward runs each block's forward again.
* ``ray_data``: a plain loop fed by ``get_dataset_shard("train").iter_torch_batches()`` over a Dataset whose
  ``map_batches`` spins 30 ms a batch of 32, one task at a time (the step waits for Ray Data); once a file ``report`` lies beside the
  stop file it also calls ``ray.train.report()`` every step.
* ``accelerate``: a plain loop under Hugging Face Accelerate (2 ranks on Ray Train's group):
  ``accelerator.accumulate`` over 2 micro-batches, bf16 autocast, a shuffled main-process DataLoader;
  Accelerate's optimizer wrapper is called every micro-batch and steps only when gradients sync.
* ``keras``: Keras 3 on its torch backend, ``model.fit`` on synthetic arrays (1 rank): Keras's own Adam updates
  the weights with torch ops after ``loss.backward()``; no ``torch.optim`` optimizer ever steps.
* ``deepspeed``: a plain loop over a DeepSpeed engine (2 ranks on Ray Train's gloo group, DeepSpeed's CPU
  accelerator): ZeRO stage 2, gradient accumulation 2, torch's AdamW given to ``deepspeed.initialize``;
  ``engine.backward(loss)`` and ``engine.step()`` every micro-batch, the optimizer stepped on the last of each two.

Run as a script: the train function lives in ``__main__`` and Ray pickles it by value.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path


def gan_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    g = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32)))
    d = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)))
    g_opt = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    d_opt = torch.optim.SGD(d.parameters(), lr=1e-2)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    step = 0
    while not (step % 20 == 0 and stop.exists()) and time.monotonic() < deadline:
        real, noise = torch.randn(64, 32), torch.randn(64, 16)
        fake = g(noise)
        d_opt.zero_grad()
        ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
        d_loss = F.binary_cross_entropy_with_logits(d(real), ones) + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
        d_loss.backward()
        d_opt.step()
        g_opt.zero_grad()
        F.binary_cross_entropy_with_logits(d(fake), ones).backward()
        g_opt.step()
        step += 1
    ray.train.report({"step": step})


def compiled_loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    step = 0
    while not (step % 20 == 0 and stop.exists()) and time.monotonic() < deadline:
        x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(compiled(x), y).backward()
        opt.step()
        step += 1
    ray.train.report({"step": step})


def fsdp2_loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)], nn.Linear(64, 10))
    for block in model[:-1]:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    step = 0
    while not (step % 20 == 0 and stop.exists()) and time.monotonic() < deadline:
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        step += 1
    ray.train.report({"step": step})


def _fit_under_ray(module: object, data: object, config: dict, find_unused_parameters: bool = False) -> None:
    """A Lightning Trainer on Ray's DDP strategy (CPU), stopped on a whole step once the stop file or the deadline is
    reached; what each Lightning job shares (pickled by value with the loop, like it)."""
    import lightning.pytorch as pl
    import ray.train.lightning as rtl

    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]

    class StopFile(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.global_step % 20 == 0 and (stop.exists() or time.monotonic() > deadline):
                trainer.should_stop = True

    trainer = pl.Trainer(
        max_epochs=10_000, accelerator="cpu", devices="auto",
        strategy=rtl.RayDDPStrategy(find_unused_parameters=find_unused_parameters),
        plugins=[rtl.RayLightningEnvironment()], callbacks=[StopFile()], enable_checkpointing=False,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    rtl.prepare_trainer(trainer).fit(module, data)


def lightning_loop(config: dict) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss, sync_dist=True)  # reduced across the ranks every step: a barrier and an all-reduce
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = DataLoader(TensorDataset(torch.randn(2048, 32), torch.randint(0, 10, (2048,))), batch_size=32)
    _fit_under_ray(Net(), data, config)


def lightning_gan_loop(config: dict) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)

    class Gan(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.g = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
            self.d = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            (real,) = batch
            g_opt, d_opt = self.optimizers()
            fake = self.g(torch.randn(real.shape[0], 16))
            ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
            d_loss = F.binary_cross_entropy_with_logits(self.d(real), ones) + F.binary_cross_entropy_with_logits(
                self.d(fake.detach()), zeros
            )
            d_opt.zero_grad()
            self.manual_backward(d_loss)
            d_opt.step()
            g_opt.zero_grad()
            self.manual_backward(F.binary_cross_entropy_with_logits(self.d(fake), ones))
            g_opt.step()

        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            return [torch.optim.Adam(self.g.parameters(), lr=2e-4), torch.optim.SGD(self.d.parameters(), lr=1e-2)]

    # Each backward leaves one model's parameters unused: DDP must look for them, as Lightning's error says.
    _fit_under_ray(Gan(), DataLoader(TensorDataset(torch.randn(2048, 32)), batch_size=64), config, find_unused_parameters=True)


def accelerate_loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, mixed_precision="bf16")
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,))), batch_size=32, shuffle=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    model, opt, data, sched = accelerator.prepare(model, opt, data, sched)
    micro = 0
    while True:  # epochs, until the stop file or the deadline (checked on whole steps)
        for x, y in data:
            with accelerator.accumulate(model):
                accelerator.backward(F.cross_entropy(model(x), y))
                opt.step()
                sched.step()
                opt.zero_grad()
            micro += 1
            if micro % 40 == 0 and (stop.exists() or time.monotonic() > deadline):
                ray.train.report({"step": micro // 2})
                return


def hf_loop(config: dict, gradient_checkpointing: bool = False) -> None:
    import tempfile

    import ray.train.huggingface.transformers as rth
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    gpt = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)

    class TokenIds(Dataset):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    class StopFile(TrainerCallback):
        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            if state.global_step % 20 == 0 and (stop.exists() or time.monotonic() > deadline):  # type: ignore[attr-defined]
                control.should_training_stop = True  # type: ignore[attr-defined]

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=1_000_000, logging_strategy="no", save_strategy="no", report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=gradient_checkpointing,
    )
    trainer = Trainer(model=GPT2LMHeadModel(gpt), args=args, train_dataset=TokenIds(), callbacks=[StopFile()])
    rth.prepare_trainer(trainer).train()


def ray_data_loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    reporting = stop.with_name("report")
    step = 0
    for batch in ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=32):
        opt.zero_grad()
        F.mse_loss(model(batch["x"]), batch["y"]).backward()
        opt.step()
        step += 1
        if reporting.exists():
            ray.train.report({"step": step})
        if (step % 20 == 0 and stop.exists()) or time.monotonic() > deadline:
            break


def keras_loop(config: dict) -> None:
    import os

    os.environ["KERAS_BACKEND"] = "torch"  # read at Keras's import
    import keras
    import numpy as np
    import torch

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]

    class StopFile(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if batch % 20 == 0 and (stop.exists() or time.monotonic() > deadline):
                self.model.stop_training = True

    model = keras.Sequential([keras.layers.Input((32,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4096, 32), dtype=np.float32), rng.integers(0, 10, 4096)
    model.fit(x, y, batch_size=32, epochs=100_000, verbose=0, callbacks=[StopFile()])


def deepspeed_loop(config: dict) -> None:
    import deepspeed
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    stop, deadline = Path(config["stop_file"]), time.monotonic() + config["max_seconds"]
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    ds_config = {
        "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2, "steps_per_print": 1_000_000,
        "zero_optimization": {"stage": 2},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=ds_config)
    data = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,))), batch_size=16, shuffle=True)
    micro = 0
    while True:  # epochs, until the stop file or the deadline (checked on whole steps)
        for x, y in data:
            engine.backward(F.cross_entropy(engine(x), y))
            engine.step()  # steps the optimizer on the last micro-batch of each accumulation only
            micro += 1
            if micro % 40 == 0 and (stop.exists() or time.monotonic() > deadline):
                ray.train.report({"step": micro // 2})
                return


def _slow_rows(seconds: float) -> object:  # a ray.data.Dataset
    import numpy as np
    import ray

    def prep(batch: dict) -> dict:
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:  # a CPU-bound transform
            pass
        rows = len(batch["id"])
        return {"x": np.ones((rows, 32), dtype=np.float32), "y": np.zeros((rows, 1), dtype=np.float32)}

    # One batch a block: each batch is ready when its own task ends (a block of many batches comes all at once).
    return ray.data.range(32 * 10_000, override_num_blocks=10_000).map_batches(prep, batch_size=32, concurrency=1)


LOOPS = {
    "gan": (gan_loop, 2), "compiled": (compiled_loop, 1), "fsdp2": (fsdp2_loop, 2), "lightning": (lightning_loop, 2),
    "hf": (hf_loop, 2), "accelerate": (accelerate_loop, 2), "lightning_gan": (lightning_gan_loop, 2),
    "hf_checkpointing": (functools.partial(hf_loop, gradient_checkpointing=True), 2), "ray_data": (ray_data_loop, 1),
    "keras": (keras_loop, 1), "deepspeed": (deepspeed_loop, 2),
}
# loop -> the Ray Datasets its workers read (get_dataset_shard), built in the driver.
DATASETS = {"ray_data": lambda: {"train": _slow_rows(0.03)}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loop", choices=sorted(LOOPS), required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--storage-path", required=True)
    p.add_argument("--max-seconds", type=float, default=600.0)
    args = p.parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, runtime_env={"worker_process_setup_hook": "actors.agent.install"}, log_to_driver=False)
    loop, workers = LOOPS[args.loop]
    trainer = TorchTrainer(
        loop,
        train_loop_config={"stop_file": args.stop_file, "max_seconds": args.max_seconds},
        scaling_config=ScalingConfig(num_workers=workers),
        datasets=DATASETS[args.loop]() if args.loop in DATASETS else None,
        run_config=RunConfig(name=args.name, storage_path=args.storage_path),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
