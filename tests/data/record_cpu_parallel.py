"""Record CPU-only traces of torch.distributed's own parallel styles, with plain torch.profiler (as
``record_cpu_issue29.py`` records, two gloo ranks each).

    PYTHONPATH=. python tests/data/record_cpu_parallel.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz`` and ``rank1...``:
  tensor_parallel  four residual MLP blocks under DTensor tensor parallelism (parallelize_module: ColwiseParallel
                   then RowwiseParallel, a 1-D device mesh of both ranks), AdamW: a functional all-reduce after each
                   block's forward and inside backward, each waited for by _c10d_functional::wait_tensor
  zero_redundancy  an MLP of six blocks under DDP stepped by torch.distributed.optim.ZeroRedundancyOptimizer
                   (AdamW): after its step each rank broadcasts its updated shard, one broadcast per parameter
  fsdp2_clip       an MLP of six blocks under FSDP2 (fully_shard per block, then the root), its gradients clipped with
                   clip_grad_norm_ each step: the norm is all-reduced through DTensor's functional collectives
Each recording takes seconds (torch 2.13.0+cpu when recorded).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.data.record_cpu_issue29 import STEPS, _two_ranks, recording, six_blocks


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(512, 2048)
        self.w2 = nn.Linear(2048, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


def _join(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)  # two ranks on two cores: one intra-op thread each, as a rank per core runs
    torch.manual_seed(0)


def _tensor_parallel_rank(rank: int, out: Path, name: str, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _join(rank, port)
    mesh = init_device_mesh("cpu", (2,))
    net = nn.Sequential(*[_Block() for _ in range(4)])
    for block in net:
        parallelize_module(block, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(16, 512)
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _classify(
    out: Path, name: str, rank: int, net: nn.Module, opt: torch.optim.Optimizer, rows: int, clip: bool = False
) -> None:
    """Record ``net`` classifying ``rows`` random rows of 512 features into 10 classes, stepped by ``opt`` (its
    gradients clipped first with ``clip``), then leave the process group."""
    x, y = torch.randn(rows, 512), torch.randint(0, 10, (rows,))
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            nn.functional.cross_entropy(net(x), y).backward()
            if clip:
                nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _zero_redundancy_rank(rank: int, out: Path, name: str, port: int) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    _join(rank, port)
    net = nn.parallel.DistributedDataParallel(six_blocks())
    _classify(
        out, name, rank, net, ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3), 128
    )


def _fsdp2_clip_rank(rank: int, out: Path, name: str, port: int) -> None:
    from torch.distributed.fsdp import fully_shard

    _join(rank, port)
    net = six_blocks()
    for block in net[:-1]:
        fully_shard(block)
    fully_shard(net)
    _classify(out, name, rank, net, torch.optim.AdamW(net.parameters(), lr=1e-3), 64, clip=True)


CASES = {
    "tensor_parallel": _tensor_parallel_rank,
    "zero_redundancy": _zero_redundancy_rank,
    "fsdp2_clip": _fsdp2_clip_rank,
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        _two_ranks(CASES[case], target, case)
