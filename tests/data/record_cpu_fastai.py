"""Record CPU-only traces of fastai's ``Learner`` training loop, unmodified, with plain torch.profiler over eight steps
and the agent's stack sampler, thread clock and gc watch (:mod:`tests.data.sampled`).

    PYTHONPATH=.:<fastai> python tests/data/record_cpu_fastai.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities only, schedule(wait=1, warmup=1,
active=8), record_shapes=True. One rank (one intra-op thread) of record_cpu_ema's 16-block MLP (66 parameter tensors)
fitted for one epoch by ``Learner(DataLoaders(train, valid), model, loss_func=mse_loss).fit(1, lr=1e-3)`` over torch
DataLoaders of a TensorDataset (batches of 256), the trace saying whose loop it is as the agent reads it (the training
thread's stack at a step boundary):
  fastai_adam          fastai's own Adam (Learner's default opt_func), which steps no torch optimizer: the step boundary
                       is the agent's backward count (actors/agent/hook.py), after each backward pass
  fastai_adamw_fused   opt_func=partial(OptimWrapper, opt=torch.optim.AdamW, fused=True): the boundary the agent's
                       optimizer post-step hook
fastai 2.8.12 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps fastai
fastcore fasttransform 'plum-dispatch<2.10' beartype fastdownload fastprogress==1.0.3 matplotlib cycler kiwisolver
fonttools scipy scikit-learn joblib threadpoolctl cloudpickle). Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_ema import _parts  # noqa: E402
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.loops import METADATA_KEY, loop_of_stack  # noqa: E402
from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402


def _fit(out: Path, name: str, opt_func: Callable[..., Any], backward_count: bool) -> None:
    """One epoch of ``Learner.fit`` under the profiler, a step after each backward pass (``backward_count``, as the
    agent counts a loop that steps no torch optimizer) or at each optimizer step."""
    from fastai.data.core import DataLoaders
    from fastai.learner import Learner

    model, _, loader = _parts()
    dls = DataLoaders(loader, torch.utils.data.DataLoader(loader.dataset, batch_size=loader.batch_size))
    learn = Learner(dls, model, loss_func=nn.functional.mse_loss, opt_func=opt_func)
    backward = torch.autograd.backward
    with recording(out, name) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)

        def boundary(*_: Any) -> None:
            if steps.calls < STEPS:  # the epoch runs on past the recorded steps
                steps.step()
            if steps.calls == 2:  # whose loop it is, from the training thread's stack as the agent reads it
                prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))

        def counted(*args: Any, **kwargs: Any) -> None:  # the agent's wrapper: Tensor.backward looks it up per call
            backward(*args, **kwargs)
            boundary()

        hook = None
        if backward_count:
            torch.autograd.backward = counted
        else:
            hook = register_optimizer_step_post_hook(boundary)
        try:
            with learn.no_logging():
                learn.fit(1, lr=1e-3)
        finally:
            torch.autograd.backward = backward
            if hook is not None:
                hook.remove()


def _adamw_fused() -> Callable[..., Any]:
    from fastai.optimizer import OptimWrapper

    return partial(OptimWrapper, opt=torch.optim.AdamW, fused=True)


def _fastai_adam() -> Callable[..., Any]:
    from fastai.optimizer import Adam

    return Adam


CASES: dict[str, Callable[[Path], None]] = {
    "fastai_adam": lambda out: _fit(out, "fastai_adam", _fastai_adam(), backward_count=True),
    "fastai_adamw_fused": lambda out: _fit(out, "fastai_adamw_fused", _adamw_fused(), backward_count=False),
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
