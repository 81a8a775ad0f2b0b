"""Which of torch's profiler activities record this worker's work: the CPU, and the accelerator it has.

NVIDIA and AMD GPUs answer ``torch.cuda`` (torch's HIP build keeps CUDA's names, and Kineto records HIP through
``ProfilerActivity.CUDA``); Intel's GPUs answer ``torch.xpu`` and are recorded through ``ProfilerActivity.XPU``
(Kineto's XPU plugin, over Intel's PTI). Asking the CUDA activity on an Intel GPU records nothing of the device, so a
window left to its default asks for the accelerator the worker has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity

from orchestrator.models.requests import ACCELERATOR_ACTIVITIES, Activity

__all__ = ["has_accelerator", "profiler_activities"]

_PROFILER_ACTIVITY: dict[Activity, ProfilerActivity] = {
    "cpu": ProfilerActivity.CPU,
    "cuda": ProfilerActivity.CUDA,
    "xpu": ProfilerActivity.XPU,
}
_LABELS: dict[Activity, str] = {"cuda": "CUDA", "xpu": "XPU"}


def has_accelerator(name: Activity) -> bool:
    """Whether this process's torch sees a device of ``name`` (``torch.cuda`` / ``torch.xpu``: the latter only in
    releases and builds that have it)."""
    module = getattr(torch, name, None)
    return module is not None and bool(module.is_available())


def profiler_activities(
    names: Sequence[Activity] | None, available: Callable[[Activity], bool] = has_accelerator
) -> list[ProfilerActivity]:
    """``torch.profiler``'s activities for a window's ``names``; ``None`` is the CPU and every accelerator the worker
    has. An accelerator asked for that the worker lacks is refused, naming it: its window would record nothing of it."""
    if names is None:
        names = ["cpu", *(a for a in ACCELERATOR_ACTIVITIES if available(a))]
    missing = [n for n in names if n != "cpu" and not available(n)]
    if missing:
        raise RuntimeError(
            f"{missing[0]} activity requested but this worker has no {_LABELS[missing[0]]} device "
            f"(it has: {', '.join(a for a in ACCELERATOR_ACTIVITIES if available(a)) or 'the CPU only'})"
        )
    return [_PROFILER_ACTIVITY[n] for n in dict.fromkeys(names)]
