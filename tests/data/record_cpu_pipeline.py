"""Record CPU-only traces of torch.distributed.pipelining (two gloo ranks, one stage each), with plain torch.profiler.

    PYTHONPATH=. python tests/data/record_cpu_pipeline.py OUT [CASE ...]

Layout and schedule are those of :mod:`tests.data.record_cpu_issue29` (``OUT/<case>/traces/rank{0,1}.pt.trace.json.gz``,
steps 2-4 of 5). Four blocks of Linear(512, 512) + ReLU and a Linear(512, 10) head, split in two stages built by hand
(``PipelineStage``); a batch of 256 in 4 micro-batches; cross-entropy on the last stage; AdamW per stage; one thread
per rank (two ranks share two cores).
  pipeline_gpipe   ScheduleGPipe, two blocks a stage (the head with the second): each stage's sends of a
                   micro-batch's activations complete while it computes the next micro-batches
  pipeline_uneven  Schedule1F1B, three blocks on the first stage and one (and the head) on the second
Each recording takes seconds (torch 2.13.0+cpu when recorded).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

from tests.data.record_cpu_issue29 import STEPS, _two_ranks, recording


def _stage_rank(rank: int, out: Path, name: str, schedule: str, first_blocks: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed import pipelining

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = [nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)]
    part = nn.Sequential(*blocks[:first_blocks]) if rank == 0 else nn.Sequential(*blocks[first_blocks:], nn.Linear(512, 10))
    stage = pipelining.PipelineStage(part, rank, 2, torch.device("cpu"))
    runner = getattr(pipelining, schedule)(stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.AdamW(part.parameters())
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    with recording(out, name, rank) as prof:
        for _ in range(STEPS):
            if rank == 0:
                runner.step(x)
            else:
                runner.step(target=y, losses=[])
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


CASES = {"pipeline_gpipe": ("ScheduleGPipe", 2), "pipeline_uneven": ("Schedule1F1B", 3)}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        _two_ranks(_stage_rank, target, case, *CASES[case])
        print("recorded", target / case, flush=True)
