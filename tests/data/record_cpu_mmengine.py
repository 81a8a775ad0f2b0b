"""Record CPU-only traces of OpenMMLab MMEngine's ``Runner`` training loop, unmodified, with plain torch.profiler.

    PYTHONPATH=.:<mmengine> python tests/data/record_cpu_mmengine.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank<N>.pt.trace.json.gz``: CPU activities only, record_shapes=True. An MLP
(record_cpu_issue29's) in an MMEngine ``BaseModel`` whose ``forward(x, y, mode='loss')`` returns a cross-entropy loss
and an L2 penalty as two terms, trained by ``Runner(model, train_dataloader=dict(batch_size=64, ...),
train_cfg=dict(by_epoch=False, max_iters=...), optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-3)))`` from a
TensorDataset, the step boundary the agent's optimizer post-step hook:
  mmengine_ddp     two gloo ranks (one intra-op thread each; the process group made before the Runner, as Ray Train
                   makes it), launcher='pytorch' (MMEngine's DDP wrapper),
                   schedule(wait=1, warmup=1, active=8), with the agent's stack sampler, thread clock and gc watch, and
                   the trace saying whose loop it is as the agent reads it (the hook's stack)
  mmengine_stacks  one rank, with_stack=True over three steps (record_cpu_issue29's schedule): the frames around each
                   read
MMEngine 0.10.7 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps
mmengine addict yapf termcolor opencv-python-headless). Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import STEPS as STACKED_STEPS  # noqa: E402
from record_cpu_issue29 import _two_ranks, mlp  # noqa: E402
from record_cpu_issue29 import recording as stacked_recording  # noqa: E402
from record_cpu_loops import STEPS, agent_recording  # noqa: E402

BATCH = 64


def _fit(iters: int, boundary: Any, launcher: str) -> None:
    """MMEngine's Runner over ``iters`` iterations, ``boundary`` run after each optimizer step."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Classifier(BaseModel):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "tensor") -> Any:
            logits = self.net(x)
            if mode == "loss":
                return {"loss_ce": nn.functional.cross_entropy(logits, y), "loss_l2": 1e-4 * logits.pow(2).mean()}
            return logits

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2 * BATCH * iters, 256), torch.randint(0, 10, (2 * BATCH * iters,)))
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model=Classifier(), work_dir=work_dir, launcher=launcher,
            train_dataloader={"dataset": data, "batch_size": BATCH, "num_workers": 0,
                              "sampler": {"type": "DefaultSampler", "shuffle": False},
                              "collate_fn": {"type": "default_collate"}},
            train_cfg={"by_epoch": False, "max_iters": iters},
            optim_wrapper={"optimizer": {"type": "AdamW", "lr": 1e-3}},
            # MMEngine's DDP wrapper is given the rank's CUDA device unless told none (a CPU module's).
            cfg={"model_wrapper_cfg": {"type": "MMDistributedDataParallel", "device_ids": None, "broadcast_buffers": False}},
            default_hooks={"checkpoint": None}, env_cfg={"dist_cfg": {"backend": "gloo"}}, log_level="WARNING",
        )
        hook = register_optimizer_step_post_hook(boundary)
        try:
            runner.train()
        finally:
            hook.remove()


def _ddp_rank(rank: int, out: Path, name: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank))
    # The group made first, as Ray Train makes it: MMEngine's own init_dist sets a CUDA device whatever the backend.
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with agent_recording(out, name, rank) as boundary:
        _fit(STEPS + 2, boundary, "pytorch")


def case_mmengine_stacks(out: Path) -> None:
    with stacked_recording(out, "mmengine_stacks", with_stack=True) as prof:
        _fit(STACKED_STEPS + 1, lambda *_: prof.step(), "none")  # one more: the profiler's cycle ends at the fifth step()


CASES = {
    "mmengine_ddp": lambda out: _two_ranks(_ddp_rank, out, "mmengine_ddp"),
    "mmengine_stacks": case_mmengine_stacks,
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
