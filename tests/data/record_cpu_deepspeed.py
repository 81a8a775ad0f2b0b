"""Record CPU-only traces of a DeepSpeed training loop (two gloo ranks), with plain torch.profiler.

    DS_ACCELERATOR=cpu PYTHONPATH=. python tests/data/record_cpu_deepspeed.py OUT [CASE ...]

DeepSpeed is not one of rayprof's dependencies: install it beside torch first (``pip install --no-deps
deepspeed==0.19.8 hjson py-cpuinfo einops ninja msgpack``; its CPU accelerator builds a shared-memory
op with ninja and the system compiler on first use). Layout and schedule are those of
:mod:`tests.data.record_cpu_issue29` (``OUT/<case>/traces/rank{0,1}.pt.trace.json.gz``, steps 2-4 of 5).
  deepspeed    an MLP (512-1024-10) under deepspeed.initialize, ZeRO stage 0, torch's AdamW, one micro-batch
               of 256 a step: engine(x), engine.backward(loss), engine.step()
  deepspeed_comm  the same with micro-batches of 8: the gradients' all-reduce outlasts the compute
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

from tests.data.record_cpu_issue29 import STEPS, _two_ranks, recording


def _deepspeed_rank(rank: int, out: Path, name: str, batch: int, width: int, fused: bool, port: int) -> None:
    import deepspeed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, width), nn.ReLU(), nn.Linear(width, 10))
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0}}
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters(), fused=fused), config=config)
    x, y = torch.randn(batch, 512), torch.randint(0, 10, (batch,))
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            prof.step()
    torch.distributed.destroy_process_group()


CASES = {
    "deepspeed": lambda out: _two_ranks(_deepspeed_rank, out, "deepspeed", 256, 1024, False),
    "deepspeed_comm": lambda out: _two_ranks(_deepspeed_rank, out, "deepspeed_comm", 2, 8192, True),
}


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
