"""Record CPU-only traces of training loops that keep an exponential moving average of the weights, with plain
torch.profiler over eight steps and the agent's stack sampler, thread clock and gc watch (:mod:`tests.data.sampled`).

    PYTHONPATH=.:<diffusers>:<timm> python tests/data/record_cpu_ema.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities only, schedule(wait=1, warmup=1,
active=8), record_shapes=True. One rank (one intra-op thread) of a 16-block MLP (Linear 128, LayerNorm, GELU: 66
parameter tensors) on batches of 256 from a DataLoader over a TensorDataset, AdamW(fused=True), and after each
optimizer step one update of the average:
  ema_diffusers          diffusers' EMAModel(model.parameters()) (foreach=False, its default), the step boundary an
                         optimizer step post-hook as rayprof's agent has it: the update opens the next step, before its
                         batch is fetched (diffusers 0.42.1 is no dependency: install it beside the recorder to record)
  ema_diffusers_foreach  the same with EMAModel(..., foreach=True)
  ema_averaged_model     torch's AveragedModel(model, avg_fn=get_ema_avg_fn(0.999)), prof.step() after the update
  ema_averaged_model_foreach  AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
  ema_averaged_model_in_memory  AveragedModel(avg_fn=...) on batches already in memory, the step boundary the
                         agent's post-hook: each step opens with the update and fetches no batch
  ema_own_loop           the loop's own average: for each tensor, average.mul_(0.999).add_(param, alpha=0.001)
  ema_timm_v2            timm's ModelEmaV2(model, decay=0.999) (timm 1.0.31 beside the recorder, its
                         timm/utils/model_ema.py loaded from its file: timm's package imports torchvision)
  ema_timm_v3            timm's ModelEmaV3(model, decay=0.999), foreach=True its default
  lightning_ema          the same model in a LightningModule under Lightning's Trainer (CPU, one device, no logger, no
                         checkpoint) with the WeightAveraging callback as Lightning's own example has it
                         (super().__init__(avg_fn=get_ema_avg_fn())), the step boundary the agent's post-hook and the
                         trace saying whose loop it is (lightning 2.6.6)
Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402

WIDTH, BLOCKS, BATCH = 128, 16, 256


def _parts() -> tuple[nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        *[m for _ in range(BLOCKS) for m in (nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU())], nn.Linear(WIDTH, 1)
    )
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * STEPS, WIDTH), torch.randn(BATCH * STEPS, 1))
    return model, torch.optim.AdamW(model.parameters(), fused=True), torch.utils.data.DataLoader(data, batch_size=BATCH)


def _record(
    out: Path, name: str, average: Callable[[nn.Module], Callable[[], None]], post_hook: bool, in_memory: bool = False
) -> None:
    """Train ``STEPS`` steps under the profiler, calling ``average(model)``'s update after each optimizer step; the
    step boundary the optimizer's post-hook (``post_hook``: the agent's) or ``prof.step()`` after the update; with
    ``in_memory``, on the loader's batches read before the profiler starts (no fetch in the steps)."""
    model, opt, loader = _parts()
    if in_memory:
        loader = list(loader)  # type: ignore[assignment]
    update = average(model)
    with recording(out, name) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
        hook = register_optimizer_step_post_hook(lambda *_: steps.step()) if post_hook else None
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            update()
            if hook is None:
                steps.step()
        if hook is not None:
            hook.remove()


def _diffusers(foreach: bool) -> Callable[[nn.Module], Callable[[], None]]:
    def average(model: nn.Module) -> Callable[[], None]:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(model.parameters(), foreach=foreach)
        return lambda: ema.step(model.parameters())

    return average


def _averaged_model(foreach: bool) -> Callable[[nn.Module], Callable[[], None]]:
    def average(model: nn.Module) -> Callable[[], None]:
        from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn

        ema = (
            AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999)) if foreach
            else AveragedModel(model, avg_fn=get_ema_avg_fn(0.999))
        )
        return lambda: ema.update_parameters(model)

    return average


def _timm(version: str) -> Callable[[nn.Module], Callable[[], None]]:
    def average(model: nn.Module) -> Callable[[], None]:
        import importlib.util

        # timm's package imports torchvision, whose wheel here is built for another torch; its model_ema module needs
        # torch alone, so it is loaded from the installed package's own file (found on the path, timm not imported).
        package = importlib.util.find_spec("timm")
        assert package is not None and package.submodule_search_locations, "install timm beside the recorder"
        path = f"{package.submodule_search_locations[0]}/utils/model_ema.py"
        spec = importlib.util.spec_from_file_location("timm.utils.model_ema", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        ema = getattr(module, version)(model, decay=0.999)
        return lambda: ema.update(model)

    return average


def _own_loop(model: nn.Module) -> Callable[[], None]:
    averages = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update_average() -> None:
        for average, param in zip(averages, model.parameters()):
            average.mul_(0.999).add_(param, alpha=0.001)

    return update_average


def _lightning_ema(out: Path) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import WeightAveraging
    from torch.optim.swa_utils import get_ema_avg_fn

    from orchestrator.loops import METADATA_KEY, Loop

    class Module(L.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), fused=True)

    class EMAWeightAveraging(WeightAveraging):  # Lightning's example, as its docstring has it
        def __init__(self) -> None:
            super().__init__(avg_fn=get_ema_avg_fn())

    model, _, loader = _parts()
    with recording(out, "lightning_ema") as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)

        def boundary(*_: object) -> None:  # the agent's step boundary, and whose loop it is once the profiler records
            steps.step()
            if steps.calls == 2:
                prof.add_metadata(METADATA_KEY, Loop.LIGHTNING.value)

        hook = register_optimizer_step_post_hook(boundary)
        try:
            L.Trainer(
                max_steps=STEPS, accelerator="cpu", devices=1, callbacks=[EMAWeightAveraging()], enable_progress_bar=False,
                logger=False, enable_model_summary=False, enable_checkpointing=False,
            ).fit(Module(model), loader)
        finally:
            hook.remove()


CASES: dict[str, Callable[[Path], None]] = {
    "ema_diffusers": lambda out: _record(out, "ema_diffusers", _diffusers(False), post_hook=True),
    "ema_diffusers_foreach": lambda out: _record(out, "ema_diffusers_foreach", _diffusers(True), post_hook=True),
    "ema_averaged_model": lambda out: _record(out, "ema_averaged_model", _averaged_model(False), post_hook=False),
    "ema_averaged_model_foreach": lambda out: _record(out, "ema_averaged_model_foreach", _averaged_model(True), post_hook=False),
    "ema_averaged_model_in_memory": lambda out: _record(
        out, "ema_averaged_model_in_memory", _averaged_model(False), post_hook=True, in_memory=True
    ),
    "ema_own_loop": lambda out: _record(out, "ema_own_loop", _own_loop, post_hook=False),
    "ema_timm_v2": lambda out: _record(out, "ema_timm_v2", _timm("ModelEmaV2"), post_hook=False),
    "ema_timm_v3": lambda out: _record(out, "ema_timm_v3", _timm("ModelEmaV3"), post_hook=False),
    "lightning_ema": _lightning_ema,
}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
        print("recorded", target / case, flush=True)
