"""Record the device traces of issue 29's analysis cases, with plain torch.profiler (no rayprof in the job).

    python3 tests/data/record_gpu_issue29.py OUT [--device cuda]

Cases, each as ``OUT/<case>/rank0.pt.trace.json.gz`` (steps 2-4 of 5):
  mask_indices  the PyTorch profiler tutorial's module in a training step: inside
                record_function("MASK INDICES") it reads a threshold with .item(), copies a
                mask to the host (mask.cpu().numpy()), runs np.argwhere there and copies the
                indices back: pageable DtoH + HtoD copies and a host round trip
  allocator     a training step that calls torch.cuda.empty_cache() and allocates a fresh
                activation-sized tensor each step: cudaFree / cudaMalloc while the device idles
  closure       Lightning's pattern: optimizer.step(closure) with Adam on a small CNN; on a GPU
                the autograd engine's device thread runs backward inside Optimizer.step
"""

from __future__ import annotations

import gzip
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def record(out: Path, name: str, step: Callable[[], None], device: torch.device) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(5):
            step()
            prof.step()
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


class MaskModule(nn.Module):
    """The profiler tutorial's example (pytorch.org/tutorials/beginner/profiler.html)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with record_function("LINEAR PASS"):
            out = self.linear(x)
        with record_function("MASK INDICES"):
            threshold = out.sum(axis=1).mean().item()
            hi_idx = np.argwhere(mask.cpu().numpy() > threshold)
            hi_idx = torch.from_numpy(hi_idx).to(x.device)
        return out, hi_idx


def main(out: Path, device: torch.device) -> None:
    torch.manual_seed(0)
    mask_model = MaskModule().to(device)
    mask_opt = torch.optim.SGD(mask_model.parameters(), lr=0.01)
    x = torch.rand(128, 500, device=device)
    mask = torch.rand((200, 200, 200), dtype=torch.double, device=device)

    def mask_step() -> None:
        out, idx = mask_model(x, mask)
        loss = out.pow(2).mean() + 0 * idx.sum()
        loss.backward()
        mask_opt.step()
        mask_opt.zero_grad()

    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    opt = torch.optim.Adam(net.parameters())
    images, labels = torch.randn(64, 3, 64, 64, device=device), torch.randint(0, 10, (64,), device=device)

    def allocator_step() -> None:
        scratch = torch.empty(64, 32, 256, 256, device=device)  # a fresh allocation every step
        scratch.normal_()
        loss = nn.functional.cross_entropy(net(images), labels) + 0 * scratch.mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        del scratch
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hands the blocks back: the next step cudaMallocs them again

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(images), labels)
        loss.backward()
        return loss

    record(out, "mask_indices", mask_step, device)
    record(out, "allocator", allocator_step, device)
    record(out, "closure", lambda: opt.step(closure), device)


if __name__ == "__main__":
    main(Path(sys.argv[1]), torch.device(sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--device" else "cuda"))
