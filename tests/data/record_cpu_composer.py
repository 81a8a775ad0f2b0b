"""Record CPU-only traces of MosaicML Composer's ``Trainer`` training loop, unmodified, with plain torch.profiler.

    PYTHONPATH=.:<composer> python tests/data/record_cpu_composer.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: CPU activities only, record_shapes=True. An MLP
(record_cpu_issue29's) in a ``ComposerClassifier`` (cross-entropy) trained by ``Trainer(model, train_dataloader,
max_duration='12ba', device='cpu', optimizers=torch.optim.AdamW(...))`` on batches of 64 from a TensorDataset, the step
boundary the agent's optimizer post-step hook:
  composer_ddp     two gloo ranks (one intra-op thread each) under Composer's own DDP, schedule(wait=1, warmup=1,
                   active=8), with the agent's stack sampler, thread clock and gc watch, and the trace saying whose
                   loop it is as the agent reads it (the hook's stack)
  composer_ddp_no_train_metrics  the same with ComposerClassifier(..., train_metrics=MetricCollection([])): no
                   training metric, so none computed (and gathered from both ranks) after each batch
  composer_stacks  one rank (Composer still makes a one-rank gloo group and runs its collectives on it),
                   with_stack=True over three steps (record_cpu_issue29's schedule): the frames around each read
Composer 0.32.1 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps
mosaicml coolname py-cpuinfo 'torch_optimizer<0.4' importlib-metadata lazy_importer 'mosaicml-cli<0.8' backoff gql
tenacity ruamel.yaml questionary validators graphql-core). Composer imports torchvision at module level, and PyPI's
torchvision 0.28 is linked against CUDA torch: put a stand-in package on the path whose modules answer every name
with a function that raises (no torchvision code runs on this path). Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import STEPS as STACKED_STEPS  # noqa: E402
from record_cpu_issue29 import _two_ranks, mlp  # noqa: E402
from record_cpu_issue29 import recording as stacked_recording  # noqa: E402
from record_cpu_loops import STEPS, agent_recording  # noqa: E402

BATCH = 64


def _fit(batches: int, boundary: Any, train_metrics: bool = True) -> None:
    """Composer's Trainer over ``batches`` batches of this rank's share, ``boundary`` run after each optimizer step;
    without ``train_metrics``, the model has none (ComposerClassifier's default is MulticlassAccuracy)."""
    from composer import Trainer
    from composer.models import ComposerClassifier
    from composer.utils import dist
    from torchmetrics import MetricCollection

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2 * BATCH * batches, 256), torch.randint(0, 10, (2 * BATCH * batches,)))
    model = ComposerClassifier(mlp(), num_classes=10, train_metrics=None if train_metrics else MetricCollection([]))
    trainer = Trainer(
        model=model, device="cpu", max_duration=f"{batches}ba", optimizers=torch.optim.AdamW(model.parameters()),
        train_dataloader=torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=dist.get_sampler(data)),
        progress_bar=False, save_folder=None,
    )
    hook = register_optimizer_step_post_hook(boundary)
    try:
        trainer.fit()
    finally:
        hook.remove()
        trainer.close()


def _ddp_rank(rank: int, out: Path, name: str, train_metrics: bool, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", NODE_RANK="0")
    with agent_recording(out, name, rank) as boundary:
        _fit(STEPS + 2, boundary, train_metrics)


def case_composer_stacks(out: Path) -> None:
    with stacked_recording(out, "composer_stacks", with_stack=True) as prof:
        _fit(STACKED_STEPS + 1, lambda *_: prof.step())  # one batch more: the profiler's cycle ends at the fifth step()


CASES = {
    "composer_ddp": lambda out: _two_ranks(_ddp_rank, out, "composer_ddp", True),
    "composer_ddp_no_train_metrics": lambda out: _two_ranks(_ddp_rank, out, "composer_ddp_no_train_metrics", False),
    "composer_stacks": case_composer_stacks,
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
