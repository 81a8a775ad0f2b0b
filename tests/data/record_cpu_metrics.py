"""Record CPU-only traces of a DDP loop that updates torchmetrics metrics every step, with plain torch.profiler over
eight steps and the agent's stack sampler, thread clock and gc watch (:mod:`tests.data.sampled`).

    PYTHONPATH=.:<torchmetrics> python tests/data/record_cpu_metrics.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: two gloo ranks (one intra-op thread each) of the
loops' MLP under DDP on batches of 64 from a DataLoader, AdamW, the step boundary an optimizer step post-hook as
rayprof's agent has it; after each step the batch's logits go to a MulticlassAccuracy and a MulticlassF1Score:
  ddp_torchmetrics          both built with dist_sync_on_step=True: every update gathers each metric state from
                            both ranks (a barrier, then all-gathers of its sizes and of the state)
  ddp_torchmetrics_default  both built with their defaults (dist_sync_on_step=False): no collective of theirs
torchmetrics 1.9.0 is no dependency: install it beside the recorder to record. Each recording takes seconds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import _two_ranks, mlp  # noqa: E402
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402


def _rank(rank: int, out: Path, name: str, on_step: bool, port: int) -> None:
    import torch.distributed as dist
    import torchmetrics

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.AdamW(net.parameters())
    metrics = [
        torchmetrics.classification.MulticlassAccuracy(num_classes=10, dist_sync_on_step=on_step),
        torchmetrics.classification.MulticlassF1Score(num_classes=10, dist_sync_on_step=on_step),
    ]
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 256), torch.randint(0, 10, (64 * STEPS,)))
    with recording(out, name, rank) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
        hook = register_optimizer_step_post_hook(lambda *_: steps.step())  # the agent's step boundary
        try:
            for x, y in torch.utils.data.DataLoader(data, batch_size=64):
                logits = net(x)
                loss = nn.functional.cross_entropy(logits, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                for metric in metrics:
                    metric(logits.detach(), y)
        finally:
            hook.remove()
    dist.destroy_process_group()


CASES: dict[str, Callable[[Path], None]] = {
    "ddp_torchmetrics": lambda out: _two_ranks(_rank, out, "ddp_torchmetrics", True),
    "ddp_torchmetrics_default": lambda out: _two_ranks(_rank, out, "ddp_torchmetrics_default", False),
}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
