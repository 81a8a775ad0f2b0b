"""Record CPU-only traces of loops that Python's garbage collector pauses, with the agent's watch over eight steps.

    PYTHONPATH=. python tests/data/record_cpu_gc.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: two gloo ranks (one intra-op thread each) of an
MLP under DDP on batches of 256, each rank holding its shard of a corpus as Python dicts (a dict and a list a
sample), plain torch.profiler (CPU, schedule(wait=1, warmup=1, active=8)) with the agent's stack sampler, thread
clock and garbage-collection watch over the recorded steps (:class:`tests.data.sampled.SampledSteps`).
  gc_collect_every_step  100,000 samples a shard; the loop calls gc.collect() after every optimizer step (a habit
               against memory growth): a full collection walks the whole corpus every step
  gc_automatic  shards of 100,000 and 130,000 samples; every step each rank keeps a record of 15,000 samples seen
               (a dict and a list each) for the epoch's end: the collector's own full collections, a few steps apart,
               in different steps on the two ranks
  gc_frozen    the same with gc.freeze() once the corpus, model and optimizer are built
Each recording takes seconds (torch 2.13.0+cpu, CPython 3.11 when recorded).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import _two_ranks, mlp  # noqa: E402
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402

RECORDS_A_STEP = 15_000


def _gc_rank(rank: int, out: Path, name: str, shards: tuple[int, int], collect: bool, log: bool, freeze: bool, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = [{"id": i, "tokens": [i, i + 1, i + 2]} for i in range(shards[rank])]
    net = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    seen: list[dict[str, object]] = []
    if freeze:
        gc.freeze()
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
        for step in range(STEPS):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            if log:
                seen.extend({"step": step, "sample": corpus[j % len(corpus)]["id"], "top": [j, j]} for j in range(RECORDS_A_STEP))
            if collect:
                gc.collect()
            steps.step()
    dist.destroy_process_group()


CASES: dict[str, Callable[[Path], None]] = {
    "gc_collect_every_step": lambda out: _two_ranks(_gc_rank, out, "gc_collect_every_step", (100_000, 100_000), True, False, False),
    "gc_automatic": lambda out: _two_ranks(_gc_rank, out, "gc_automatic", (100_000, 130_000), False, True, False),
    "gc_frozen": lambda out: _two_ranks(_gc_rank, out, "gc_frozen", (100_000, 130_000), False, True, True),
}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
