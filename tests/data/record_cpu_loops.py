"""Record CPU-only traces of loops whose steps are not all alike, with plain torch.profiler over eight steps.

    PYTHONPATH=. python tests/data/record_cpu_loops.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: CPU activities only, schedule(wait=1, warmup=1,
active=8), record_shapes=True, so steps 2-9 of 10 (eight steps: a cost that recurs shows more than once).
  ddp_varlen   two gloo ranks (one intra-op thread each), a one-layer TransformerEncoder under DDP on batches of 8
               sequences whose length each rank draws from 16-400 every step (its own seed): a different rank has
               the longer batch in each step, and the other waits for it in DDP's all-reduce
  loader_restart  an MLP fed by DataLoader(num_workers=2) over 24 samples in batches of 8: three steps an epoch;
               without persistent_workers each epoch's end shuts the two workers down and the next starts new ones
  loader_persistent  the same with persistent_workers=True: the workers live across epochs
  lightning_loader_restart  the loader_restart loader under a Lightning Trainer (CPU, no logger, no checkpoint), a
               Callback calling prof.step() per batch: Lightning reads a batch ahead, so the read that ends an epoch
               falls in the step before the new epoch's first
  evaluate_often  an MLP fed by a DataLoader(num_workers=0) that evaluates on four batches of another after every
               third step, before the next step fetches its batch: three evaluations in the window
  ddp_accumulate  two gloo ranks (one intra-op thread each), an MLP of 1.3 M parameters under DDP accumulating the
               gradients of four micro-batches of 32 a step, each backward all-reducing them (no no_sync())
  ddp_no_sync  the same with the first three micro-batches under DDP's no_sync(): one all-reduce a step
  fsdp2_accumulate  two gloo ranks of a three-unit FSDP2 MLP (fully_shard on two blocks and the root) accumulating
               four micro-batches of 32 a step, each backward reducing the gradients (gloo all-reduces them)
  ddp_contended  two gloo ranks of an MLP under DDP, each pinned to a core of its own, and a process spinning on rank
               0's core beside it; the agent's stack sampler and thread clock over the recorded steps
  ddp_own_cores  the same without the spinning process
  lightning_ddp_accumulate  a Lightning Trainer under DDP on two gloo ranks with accumulate_grad_batches=4, the step
               boundary a global optimizer step post-hook (as rayprof's agent has it): Lightning skips DDP's sync itself
  lightning_sync_dist  a Lightning Trainer under DDP on two gloo ranks (batches of 64) whose training_step logs its
               loss and three metrics with self.log(..., sync_dist=True) (each value all-reduced every step), the step boundary a
               global optimizer step post-hook with the agent's stack sampler, thread clock and gc watch, and the
               trace saying whose loop it is, as the agent writes it
  ignite       two gloo ranks (one intra-op thread each) of an MLP under DDP trained by PyTorch Ignite's
               create_supervised_trainer with a RunningAverage of the loss (which all-reduces it every iteration),
               the step boundary a global optimizer step post-hook with the agent's stack sampler, thread clock and gc
               watch (pytorch-ignite 0.5.5 is no dependency: install it beside the recorder to record)
  ignite_stacks  one rank of the MLP under create_supervised_trainer with its defaults (no DDP, no metric),
               with_stack=True over three steps (record_cpu_issue29's schedule): the frames around each read
  tensor_dataset  a small MLP (one intra-op thread) fed by DataLoader(TensorDataset, batch_size=256, shuffle=True,
               num_workers=0) over tensors in memory: the loader fetches and stacks 256 samples one by one each step
  keras_loader Keras 3's fit() on its torch backend over a DataLoader(num_workers=0) whose __getitem__ decodes each
               sample (0.5 ms) and reads its label with .item(); Keras steps no torch optimizer, so the step boundary
               is the agent's backward count (actors/agent/hook.py), with its stack sampler, thread clock and gc watch
               and the trace saying whose loop it is (keras 3.15.1)
Each recording takes seconds (torch 2.13.0+cpu, lightning 2.6.6 when recorded).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import STEPS as STACKED_STEPS  # noqa: E402
from record_cpu_issue29 import _two_ranks, fit_on_two_ranks, lightning_parts, lightning_rank_env, mlp  # noqa: E402
from record_cpu_issue29 import recording as stacked_recording  # noqa: E402

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402

ACTIVE = 8
STEPS = ACTIVE + 2
MICRO_BATCHES = 4


@contextmanager
def recording(out: Path, name: str, rank: int = 0) -> Iterator[Any]:
    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"rank{rank}.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=ACTIVE),
                 record_shapes=True, on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        yield prof
    with raw.open("rb") as src, gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


@contextmanager
def agent_recording(out: Path, name: str, rank: int = 0) -> Iterator[Callable[..., None]]:
    """:func:`recording` with the agent's step boundary, to run where the agent ends a step (an optimizer post-step
    hook): its stack sampler, thread clock and gc watch over the recorded steps, and whose loop it is, read from the
    boundary's stack as the agent reads it, written into the trace at the second step. Steps past the recorded ones
    are not counted (a framework's epoch runs on)."""
    from orchestrator.loops import METADATA_KEY, loop_of_stack

    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)

        def boundary(*_: Any) -> None:
            if steps.calls < STEPS:
                steps.step()
            if steps.calls == 2:
                prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))

        yield boundary


def _varlen_rank(rank: int, out: Path, name: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)  # two ranks on two cores: each its own
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 1))
    opt = torch.optim.AdamW(net.parameters())
    lengths = torch.Generator().manual_seed(100 + rank)
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            x = torch.randn(8, int(torch.randint(16, 400, (1,), generator=lengths)), 64)
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _accumulate_rank(rank: int, out: Path, name: str, no_sync: bool, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # 1.3 M parameters on batches of 32: the gradients' all-reduce outweighs a micro-batch's compute, as it does for
    # a large model on a fast device.
    net = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
    opt = torch.optim.AdamW(net.parameters())
    micro = [(torch.randn(32, 256), torch.randint(0, 10, (32,))) for _ in range(MICRO_BATCHES)]
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            for i, (x, y) in enumerate(micro):
                with net.no_sync() if no_sync and i < len(micro) - 1 else nullcontext():
                    (nn.functional.cross_entropy(net(x), y) / len(micro)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _fsdp2_accumulate_rank(rank: int, out: Path, name: str, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(2)], nn.Linear(512, 10))
    for block in net[:-1]:
        fully_shard(block)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters())
    micro = [(torch.randn(32, 512), torch.randint(0, 10, (32,))) for _ in range(MICRO_BATCHES)]
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            for x, y in micro:
                (nn.functional.cross_entropy(net(x), y) / len(micro)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _contended_rank(rank: int, out: Path, name: str, burner: bool, port: int) -> None:
    import subprocess

    import torch.distributed as dist

    # Each rank on a core of its own (its gloo threads, started below, inherit it); where ``burner``, a process
    # spinning on rank 0's core beside it for at most two minutes.
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    spin = "import os, time\nos.sched_setaffinity(0, {0})\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"
    other = subprocess.Popen([sys.executable, "-c", spin]) if burner and rank == 0 else None
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        torch.set_num_threads(1)
        torch.manual_seed(0)
        net = nn.parallel.DistributedDataParallel(mlp())
        opt = torch.optim.AdamW(net.parameters())
        x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
        with recording(out, name, rank) as prof:
            steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
            for _ in range(STEPS):
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                opt.zero_grad()
                steps.step()
        dist.destroy_process_group()
    finally:
        if other is not None:
            other.kill()
            other.wait()


def _lightning_accumulate_rank(rank: int, out: Path, name: str, port: int) -> None:
    lightning_rank_env(rank, port)
    torch.manual_seed(0)
    module, _ = lightning_parts()
    data = torch.utils.data.TensorDataset(torch.randn(2 * 64 * MICRO_BATCHES * STEPS, 256),
                                          torch.randint(0, 10, (2 * 64 * MICRO_BATCHES * STEPS,)))
    with recording(out, name, rank) as prof:
        fit_on_two_ranks(module, data, 64, STEPS, lambda *_: prof.step(), accumulate_grad_batches=MICRO_BATCHES)


def _lightning_sync_dist_rank(rank: int, out: Path, name: str, port: int) -> None:
    from orchestrator.loops import METADATA_KEY, Loop

    lightning_rank_env(rank, port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module, _ = lightning_parts(sync_dist=True)
    data = torch.utils.data.TensorDataset(torch.randn(2 * 64 * STEPS, 256), torch.randint(0, 10, (2 * 64 * STEPS,)))
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)

        def boundary(*_: Any) -> None:  # the agent's step boundary, and whose loop it is once the profiler records
            steps.step()
            if steps.calls == 2:
                prof.add_metadata(METADATA_KEY, Loop.LIGHTNING.value)

        fit_on_two_ranks(module, data, 64, STEPS, boundary)


def _ignite_rank(rank: int, out: Path, name: str, port: int) -> None:
    import torch.distributed as dist
    from ignite.engine import Events, create_supervised_trainer
    from ignite.metrics import RunningAverage
    from torch.optim.optimizer import register_optimizer_step_post_hook

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(mlp())
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 256), torch.randint(0, 10, (64 * STEPS,)))
    trainer = create_supervised_trainer(net, torch.optim.AdamW(net.parameters()), nn.CrossEntropyLoss())
    RunningAverage(output_transform=lambda loss: loss).attach(trainer, "loss")
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=STEPS + 1), lambda engine: engine.terminate())
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
        hook = register_optimizer_step_post_hook(lambda *_: steps.step())  # the agent's step boundary
        try:
            trainer.run(torch.utils.data.DataLoader(data, batch_size=64), max_epochs=2)
        finally:
            hook.remove()
    dist.destroy_process_group()


def case_ignite_stacks(out: Path) -> None:
    from ignite.engine import Events, create_supervised_trainer
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = mlp()
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 256), torch.randint(0, 10, (64 * STEPS,)))
    trainer = create_supervised_trainer(net, torch.optim.AdamW(net.parameters()), nn.CrossEntropyLoss())
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=STACKED_STEPS + 1), lambda engine: engine.terminate())
    with stacked_recording(out, "ignite_stacks", with_stack=True) as prof:
        hook = register_optimizer_step_post_hook(lambda *_: prof.step())  # the agent's step boundary
        try:
            trainer.run(torch.utils.data.DataLoader(data, batch_size=64), max_epochs=1)
        finally:
            hook.remove()


class Samples(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.randn(256), i % 10


def case_loader(out: Path, name: str, persistent: bool) -> None:
    net = mlp()
    opt = torch.optim.Adam(net.parameters())
    loader = torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=2, persistent_workers=persistent)
    done = 0
    with recording(out, name) as prof:
        while done < STEPS:
            for x, y in loader:
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                opt.zero_grad()
                prof.step()
                done += 1
                if done == STEPS:
                    break


def case_evaluate_often(out: Path) -> None:
    net = mlp()
    opt = torch.optim.Adam(net.parameters())
    train = torch.utils.data.DataLoader(Samples(), batch_size=8)
    val = torch.utils.data.DataLoader(Samples(), batch_size=6)
    batches = iter(())
    with recording(out, "evaluate_often") as prof:
        for step in range(STEPS):
            if step and step % 3 == 0:
                with torch.no_grad():
                    for x, y in val:
                        nn.functional.cross_entropy(net(x), y)
            x, y = next(batches, None) or next(batches := iter(train))
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def case_lightning_loader_restart(out: Path) -> None:
    import lightning as L

    module, Step = lightning_parts()
    with recording(out, "lightning_loader_restart") as prof:
        L.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
            enable_model_summary=False, enable_checkpointing=False, callbacks=[Step(prof)],
        ).fit(module, torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=2))


def case_tensor_dataset(out: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(256 * STEPS, 64), torch.randint(0, 10, (256 * STEPS,)))
    with recording(out, "tensor_dataset") as prof:
        for x, y in torch.utils.data.DataLoader(data, batch_size=256, shuffle=True):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def case_keras_loader(out: Path) -> None:
    import time

    os.environ["KERAS_BACKEND"] = "torch"  # read at Keras's import
    import keras

    from actors.agent.hook import _BackwardWatch
    from orchestrator.loops import METADATA_KEY, Loop

    class Decoded(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        def __len__(self) -> int:
            return 32 * STEPS

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.0005:  # decoding the sample
                pass
            return torch.randn(32), torch.randint(0, 10, ()).item()

    torch.set_num_threads(1)
    model = keras.Sequential([keras.layers.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with recording(out, "keras_loader") as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)

        def boundary() -> None:  # the agent's step boundary, and whose loop it is once the profiler records
            steps.step()
            if steps.calls == 2:
                prof.add_metadata(METADATA_KEY, Loop.KERAS.value)

        watch = _BackwardWatch(torch.autograd, boundary)
        try:
            model.fit(torch.utils.data.DataLoader(Decoded(), batch_size=32), epochs=1, verbose=0)
        finally:
            watch.remove()


CASES: dict[str, Callable[[Path], None]] = {
    "ddp_varlen": lambda out: _two_ranks(_varlen_rank, out, "ddp_varlen"),
    "loader_restart": lambda out: case_loader(out, "loader_restart", persistent=False),
    "loader_persistent": lambda out: case_loader(out, "loader_persistent", persistent=True),
    "evaluate_often": case_evaluate_often,
    "lightning_loader_restart": case_lightning_loader_restart,
    "ddp_accumulate": lambda out: _two_ranks(_accumulate_rank, out, "ddp_accumulate", False),
    "ddp_no_sync": lambda out: _two_ranks(_accumulate_rank, out, "ddp_no_sync", True),
    "lightning_ddp_accumulate": lambda out: _two_ranks(_lightning_accumulate_rank, out, "lightning_ddp_accumulate"),
    "lightning_sync_dist": lambda out: _two_ranks(_lightning_sync_dist_rank, out, "lightning_sync_dist"),
    "ignite": lambda out: _two_ranks(_ignite_rank, out, "ignite"),
    "ignite_stacks": case_ignite_stacks,
    "fsdp2_accumulate": lambda out: _two_ranks(_fsdp2_accumulate_rank, out, "fsdp2_accumulate"),
    "ddp_contended": lambda out: _two_ranks(_contended_rank, out, "ddp_contended", True),
    "ddp_own_cores": lambda out: _two_ranks(_contended_rank, out, "ddp_own_cores", False),
    "keras_loader": case_keras_loader,
    "tensor_dataset": case_tensor_dataset,
}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
