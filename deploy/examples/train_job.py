"""Example Ray Train job: a small ResNet-style CNN on FashionMNIST-shaped data.

Modelled on the Ray Train + PyTorch profiler tutorial, with synthetic data by
default so nothing is downloaded. Runs on CPU (gloo) or GPU (nccl).

    python deploy/examples/train_job.py --name my-run --workers 2 --max-seconds 600

Planted faults (for rayprof's own tests of stacks, stall and watches):
  --hang-rank R --hang-at-step N   every step also all-reduces the loss (a global loss for logging);
                                   rank R sleeps forever just before it at step N, the others block in it
  --slow-from-step N --slowdown F  from step N every step takes F times as long (all ranks)
  --no-ddp                         each rank trains its own model: ranks are not coupled, so a
                                   --slow-rank falls steps behind instead of slowing everyone
  --flight-recorder N              keep torch's flight recorder (TORCH_FR_BUFFER_SIZE=N)
  --relay                          agents poll through a relay per node even at 2 ranks
  --gc-collect-objects N           each rank holds N Python records (a dict and a list each) and calls
                                   gc.collect() after every optimizer step, a habit against memory growth:
                                   a full collection walks all of them every step

How rayprof gets in (``--instrument``):
  setup-hook  ray.init(runtime_env={"worker_process_setup_hook": "actors.agent.install"}); no code change
  attach      the train function calls actors.agent.attach()
  none        nothing here (use when the job is submitted with the hook in its runtime_env)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SETUP_HOOK = "actors.agent.install"


class SyntheticFashionMNIST(Dataset):
    """28x28 grayscale images in 10 classes, generated deterministically."""

    def __init__(self, size: int = 4096, seed: int = 0, delay_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (size,), generator=g)
        # A class-dependent pattern plus noise, so the model has something to learn.
        patterns = torch.randn(10, 1, 28, 28, generator=g)
        self.images = patterns[self.labels] + 0.5 * torch.randn(size, 1, 28, 28, generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.images[i], self.labels[i]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """Two residual stages; ~80k parameters, a few ms per step on one CPU thread."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _planted_hang() -> None:
    """Sleep forever, as a rank stuck in its own code would."""
    while True:
        time.sleep(3600)


def train_loop(config: dict) -> None:
    """The per-worker training function."""
    import ray.train
    import ray.train.torch

    torch.set_num_threads(config["threads"])
    if config["instrument"] == "attach":
        from actors import agent

        agent.attach(use_optimizer_hook=config["step_mode"] == "optimizer")

    rank = ray.train.get_context().get_world_rank()
    delay = config["data_delay_s"]
    model = SmallResNet(width=config["width"])
    if not config["no_ddp"]:
        model = ray.train.torch.prepare_model(model)
    loader = DataLoader(
        SyntheticFashionMNIST(size=config["dataset_size"], seed=rank, delay_s=delay),
        batch_size=config["batch_size"],
        shuffle=True,
        num_workers=0,
    )
    loader = ray.train.torch.prepare_data_loader(loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    stop_file = Path(config["stop_file"]) if config["stop_file"] else None
    deadline = time.monotonic() + config["max_seconds"]
    slow_rank, slow_s = config["slow_rank"], config["slow_rank_delay_s"]
    hang_rank, hang_at = config["hang_rank"], config["hang_at_step"]
    slow_from, slowdown = config["slow_from_step"], config["slowdown"]
    # Mean step time over the steps before slow_from, measured here so the slowdown is a true factor.
    before: list[float] = []
    extra_s = 0.0
    collect = config["gc_collect_objects"] > 0
    _records = [{"id": i, "tokens": [i, i + 1]} for i in range(config["gc_collect_objects"])]  # for the collector to walk

    step, loss = 0, torch.tensor(0.0)
    while True:
        for images, labels in loader:
            started = time.monotonic()
            loss = F.cross_entropy(model(images), labels)
            if rank == slow_rank and slow_s:
                time.sleep(slow_s)
            if extra_s:
                time.sleep(extra_s)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if collect:
                gc.collect()
            if config["instrument"] == "attach" and config["step_mode"] == "explicit":
                agent.step()
            step += 1
            if hang_rank >= 0:
                global_loss = loss.detach().clone()
                if rank == hang_rank and step == hang_at:
                    _planted_hang()
                torch.distributed.all_reduce(global_loss)
            if slow_from > 0 and step < slow_from:
                before = [*before[-49:], time.monotonic() - started]
            elif slow_from > 0 and step == slow_from and before:
                extra_s = (slowdown - 1.0) * sum(before) / len(before)
            done = step >= config["max_steps"] > 0 or time.monotonic() > deadline
            if done or (stop_file is not None and step % 20 == 0 and stop_file.exists()):
                ray.train.report({"step": step, "loss": float(loss)})
                return


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="fashion-resnet", help="Ray Train run name: the rayprof target")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (nccl)")
    p.add_argument(
        "--resources-per-worker",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='e.g. \'{"CPU": 1, "trainer_slot": 1}\': a custom resource each node has one of puts every worker on its own node',
    )
    p.add_argument("--instrument", choices=["setup-hook", "attach", "none"], default="setup-hook")
    p.add_argument("--step-mode", choices=["optimizer", "explicit"], default="optimizer")
    p.add_argument("--max-steps", type=int, default=0, help="0: no step limit")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--stop-file", default="", help="stop once this file exists")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--dataset-size", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--data-delay-s", type=float, default=0.0, help="sleep per sample (a slow Dataset)")
    p.add_argument("--slow-rank", type=int, default=-1, help="a rank that sleeps every step (a straggler)")
    p.add_argument("--slow-rank-delay-s", type=float, default=0.0)
    p.add_argument("--hang-rank", type=int, default=-1, help="a rank that sleeps forever at --hang-at-step")
    p.add_argument("--hang-at-step", type=int, default=40)
    p.add_argument("--slow-from-step", type=int, default=0, help="from this step every step takes --slowdown x as long")
    p.add_argument("--slowdown", type=float, default=1.5)
    p.add_argument("--no-ddp", action="store_true", help="each rank trains its own model (ranks not coupled)")
    p.add_argument("--flight-recorder", type=int, default=0, help="TORCH_FR_BUFFER_SIZE for the workers (0: off)")
    p.add_argument("--relay", action="store_true", help="agents poll through a relay per node at any world size")
    p.add_argument("--gc-collect-objects", type=int, default=0, help="records to hold; gc.collect() every step (0: off)")
    p.add_argument("--max-failures", type=int, default=0, help="worker group restarts Ray Train allows")
    p.add_argument("--storage-path", default=os.environ.get("RAYPROF_TRAIN_STORAGE", "/tmp/rayprof-train"))
    p.add_argument("--address", default=None, help="Ray cluster address (default: auto/local)")
    return p.parse_args(argv)


def job_runtime_env(args: argparse.Namespace) -> dict | None:
    """The runtime_env this driver passes to ray.init(): the agent's setup hook with ``--instrument setup-hook``,
    torch's flight recorder with ``--flight-recorder``, relays at any size with ``--relay``."""
    runtime_env: dict = {"worker_process_setup_hook": SETUP_HOOK} if args.instrument == "setup-hook" else {}
    env_vars: dict[str, str] = {}
    if args.flight_recorder:
        env_vars["TORCH_FR_BUFFER_SIZE"] = str(args.flight_recorder)
    if args.relay:
        from orchestrator.settings import RELAY_MIN_WORLD_SIZE_ENV_VAR

        env_vars[RELAY_MIN_WORLD_SIZE_ENV_VAR] = "1"
    if env_vars:
        runtime_env["env_vars"] = env_vars
    return runtime_env or None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, runtime_env=job_runtime_env(args), log_to_driver=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "instrument": args.instrument,
            "step_mode": args.step_mode,
            "max_steps": args.max_steps,
            "max_seconds": args.max_seconds,
            "stop_file": args.stop_file,
            "batch_size": args.batch_size,
            "width": args.width,
            "dataset_size": args.dataset_size,
            "threads": args.threads,
            "data_delay_s": args.data_delay_s,
            "slow_rank": args.slow_rank,
            "slow_rank_delay_s": args.slow_rank_delay_s,
            "hang_rank": args.hang_rank,
            "hang_at_step": args.hang_at_step,
            "slow_from_step": args.slow_from_step,
            "slowdown": args.slowdown,
            "gc_collect_objects": args.gc_collect_objects,
            "no_ddp": args.no_ddp,
        },
        scaling_config=ScalingConfig(
            num_workers=args.workers, use_gpu=args.gpu, resources_per_worker=args.resources_per_worker
        ),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    result = trainer.fit()
    print(f"training finished: {result.metrics}")


if __name__ == "__main__":
    main()
