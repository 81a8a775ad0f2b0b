"""Record CPU-only traces of a DeepSpeed training loop (two gloo ranks), with plain torch.profiler.

    DS_ACCELERATOR=cpu PYTHONPATH=. python tests/data/record_cpu_deepspeed.py OUT [CASE ...]

DeepSpeed is pinned in the dev extra (``make setup`` installs it); its CPU accelerator builds a shared-memory op with
ninja and the system compiler on first use. Layout and schedule are those of
:mod:`tests.data.record_cpu_issue29` (``OUT/<case>/traces/rank{0,1}.pt.trace.json.gz``, steps 2-4 of 5).
  deepspeed    an MLP (512-1024-10) under deepspeed.initialize, ZeRO stage 0, torch's AdamW, one micro-batch
               of 256 a step: engine(x), engine.backward(loss), engine.step()
  deepspeed_comm  the same with micro-batches of 8: the gradients' all-reduce outlasts the compute
  deepspeed_zero0 ... deepspeed_zero3  an MLP of nine 1024-wide layers (8.4 M parameters, about 1 M a layer),
               micro-batches of 2, at ZeRO stage 0, 1, 2 or 3 with gradient_accumulation_steps 2 (two micro-batches a
               step), with the agent's stack samples (every millisecond; with_stack=True slows this loop five times
               over): the default reduce_bucket_size holds every gradient, so stages 0 to 2 reduce them after backward
               (stage 2 on every micro-batch); stage 3 reduce-scatters them during backward and gathers the
               parameters in forward and backward
  deepspeed_zero2_buckets  deepspeed_zero2 with the fix it is told: "overlap_comm": true, "reduce_bucket_size": 2e6
               (a quarter of the gradients), so its buckets but the last are reduced during each backward
  deepspeed_zero1_bf16  deepspeed_zero1 with bf16 weights and fp32 gradient accumulation: BF16_Optimizer
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tests.data.record_cpu_issue29 import STEPS, _two_ranks, recording


def _deepspeed_rank(
    rank: int, out: Path, name: str, batch: int, width: int, fused: bool, stage: int, micro: int, sampled: bool,
    bucket: int | None, blocks: int, bf16: bool, port: int
) -> None:
    import deepspeed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.manual_seed(0)
    hidden = [m for _ in range(blocks) for m in (nn.Linear(width, width), nn.ReLU())]
    net = nn.Sequential(nn.Linear(512, width), nn.ReLU(), *hidden, nn.Linear(width, 10))
    zero = {"stage": stage} | ({"overlap_comm": True, "reduce_bucket_size": bucket} if bucket else {})
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": micro, "zero_optimization": zero}
    if bf16:  # bf16 weights, fp32 gradient accumulation: BF16_Optimizer at stage 1
        config |= {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters(), fused=fused), config=config)
    x, y = torch.randn(batch, 512, dtype=torch.bfloat16 if bf16 else None), torch.randint(0, 10, (batch,))
    with recording(out, name, rank, sample_s=0.001 if sampled else None) as prof:
        for _ in range(STEPS):
            for _ in range(micro):  # engine.step() steps the optimizer on the last micro-batch only
                loss = nn.functional.cross_entropy(engine(x), y)
                engine.backward(loss)
                engine.step()
            prof.step()
    torch.distributed.destroy_process_group()


def _case(
    name: str, batch: int, width: int, fused: bool, stage: int = 0, micro: int = 1, sampled: bool = False,
    bucket: int | None = None, blocks: int = 0, bf16: bool = False,
) -> Callable[[Path], None]:
    return lambda out: _two_ranks(_deepspeed_rank, out, name, batch, width, fused, stage, micro, sampled, bucket, blocks, bf16)


CASES = {
    "deepspeed": _case("deepspeed", 256, 1024, False),
    "deepspeed_comm": _case("deepspeed_comm", 2, 8192, True),
    **{f"deepspeed_zero{s}": _case(f"deepspeed_zero{s}", 2, 1024, True, s, 2, sampled=True, blocks=7) for s in (0, 1, 2, 3)},
    "deepspeed_zero2_buckets": _case("deepspeed_zero2_buckets", 2, 1024, True, 2, 2, sampled=True, bucket=2_000_000, blocks=7),
    "deepspeed_zero1_bf16": _case("deepspeed_zero1_bf16", 2, 1024, True, 1, 2, sampled=True, blocks=7, bf16=True),
}


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
