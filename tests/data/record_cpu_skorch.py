"""Record CPU-only traces of skorch's ``NeuralNet`` training loop, unmodified, with plain torch.profiler.

    PYTHONPATH=.:<skorch> python tests/data/record_cpu_skorch.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities only, record_shapes=True. An MLP
(record_cpu_issue29's) fitted by ``NeuralNetClassifier(module, criterion=nn.CrossEntropyLoss,
optimizer=torch.optim.AdamW, batch_size=64, train_split=None).fit(X, y)`` on one CPU thread. skorch steps every
optimizer with a closure (``optimizer.step(step_fn)``: forward and backward run inside ``Optimizer.step``), and the
step boundary is the agent's optimizer post-step hook:
  skorch           schedule(wait=1, warmup=1, active=8), with the agent's stack sampler, thread clock and gc watch, and
                   the trace saying whose loop it is as the agent reads it (the hook's stack)
  skorch_stacks    with_stack=True over three steps (record_cpu_issue29's schedule): the frames around each read
skorch 1.4.0 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps skorch
scikit-learn scipy joblib threadpoolctl). Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_issue29 import STEPS as STACKED_STEPS  # noqa: E402
from record_cpu_issue29 import mlp  # noqa: E402
from record_cpu_issue29 import recording as stacked_recording  # noqa: E402
from record_cpu_loops import STEPS, agent_recording  # noqa: E402

BATCH = 64


def _fit(batches: int, boundary: Any) -> None:
    """One epoch of ``batches`` batches, ``boundary`` run after each optimizer step."""
    from skorch import NeuralNetClassifier

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = NeuralNetClassifier(mlp(), criterion=nn.CrossEntropyLoss, optimizer=torch.optim.AdamW, lr=1e-3, max_epochs=1,
                              batch_size=BATCH, train_split=None, verbose=0)
    hook = register_optimizer_step_post_hook(boundary)
    try:
        net.fit(torch.randn(BATCH * batches, 256), torch.randint(0, 10, (BATCH * batches,)))
    finally:
        hook.remove()


def case_skorch(out: Path) -> None:
    with agent_recording(out, "skorch") as boundary:
        _fit(STEPS + 2, boundary)


def case_skorch_stacks(out: Path) -> None:
    with stacked_recording(out, "skorch_stacks", with_stack=True) as prof:
        _fit(STACKED_STEPS + 1, lambda *_: prof.step())  # one more: the profiler's cycle ends at the fifth step()


CASES = {"skorch": case_skorch, "skorch_stacks": case_skorch_stacks}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
