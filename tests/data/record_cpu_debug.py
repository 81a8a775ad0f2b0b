"""Record CPU-only traces of loops that leave autograd's anomaly detection on, a debugging aid.

    PYTHONPATH=. python tests/data/record_cpu_debug.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz`` (one intra-op thread a rank):
  anomaly            two gloo ranks of record_cpu_issue29's six_blocks() under DDP, AdamW, batches of 128, under
                     torch.autograd.set_detect_anomaly(True); plain torch.profiler (CPU, schedule(wait=1, warmup=1,
                     active=8)) with the agent's stack sampler over the recorded steps
  anomaly_off        the same loop without it: the step it measures against
  anomaly_rank0      the same loop with it on rank 0 alone (a rank-gated debugging aid)
  lightning_anomaly  a Lightning Trainer(detect_anomaly=True) under DDP on two gloo ranks (record_cpu_issue29's
                     LightningModule, batches of 64), the step boundary where the agent puts it, the loop named as the
                     agent names it, the agent's stack sampler
  anomaly_stack      one process, record_cpu_issue29's mlp() and Adam under torch.autograd.detect_anomaly(),
                     with_stack=True (schedule(wait=1, warmup=1, active=3)): forward's tracebacks as Python frames
Each recording takes seconds (torch 2.13.0+cpu, lightning 2.6, CPython 3.11 when recorded).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import STEPS as SHORT  # noqa: E402
from record_cpu_issue29 import _two_ranks, fit_on_two_ranks, lightning_parts, lightning_rank_env, mlp, six_blocks  # noqa: E402
from record_cpu_issue29 import recording as short_recording  # noqa: E402
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.loops import METADATA_KEY, Loop  # noqa: E402
from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402

SAMPLE_S = DEFAULT_FRAME_SAMPLE_MS / 1000


def _ddp_rank(rank: int, out: Path, name: str, anomaly: tuple[int, ...], port: int) -> None:
    """The DDP loop on this rank, under anomaly detection where ``rank`` is in ``anomaly``."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(six_blocks())
    opt = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))
    torch.autograd.set_detect_anomaly(rank in anomaly)
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=SAMPLE_S)
        for _ in range(STEPS):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps.step()
    dist.destroy_process_group()


def _lightning_rank(rank: int, out: Path, name: str, port: int) -> None:
    lightning_rank_env(rank, port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module, _ = lightning_parts()
    data = torch.utils.data.TensorDataset(torch.randn(2 * 64 * STEPS, 256), torch.randint(0, 10, (2 * 64 * STEPS,)))
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=SAMPLE_S)

        def boundary(*_: Any) -> None:  # the agent's step boundary, and whose loop it is once the profiler records
            steps.step()
            if steps.calls == 2:
                prof.add_metadata(METADATA_KEY, Loop.LIGHTNING.value)

        fit_on_two_ranks(module, data, 64, STEPS, boundary, detect_anomaly=True)


def case_anomaly_stack(out: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = mlp()
    opt = torch.optim.Adam(net.parameters())
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    with torch.autograd.detect_anomaly(), short_recording(out, "anomaly_stack", with_stack=True) as prof:
        for _ in range(SHORT):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()


CASES: dict[str, Callable[[Path], None]] = {
    "anomaly": lambda out: _two_ranks(_ddp_rank, out, "anomaly", (0, 1)),
    "anomaly_off": lambda out: _two_ranks(_ddp_rank, out, "anomaly_off", ()),
    "anomaly_rank0": lambda out: _two_ranks(_ddp_rank, out, "anomaly_rank0", (0,)),
    "lightning_anomaly": lambda out: _two_ranks(_lightning_rank, out, "lightning_anomaly"),
    "anomaly_stack": case_anomaly_stack,
}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
