"""Which profiler activities a window asks torch for: the CPU and the accelerator the worker has."""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerActivity

from actors.agent.devices import profiler_activities


def _has(*names: str):
    return lambda name: name in names


def test_a_window_left_to_its_default_records_the_cpu_alone_on_a_worker_without_an_accelerator():
    assert profiler_activities(None, _has()) == [ProfilerActivity.CPU]


def test_a_window_left_to_its_default_records_an_nvidia_or_amd_gpu_through_the_cuda_activity():
    assert profiler_activities(None, _has("cuda")) == [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def test_a_window_left_to_its_default_records_an_intel_gpu_through_the_xpu_activity():
    # Asking CUDA's activity there would record nothing of the device.
    assert profiler_activities(None, _has("xpu")) == [ProfilerActivity.CPU, ProfilerActivity.XPU]


def test_the_activities_asked_for_are_what_torch_is_given_once_each_in_their_order():
    assert profiler_activities(["xpu", "cpu", "xpu"], _has("xpu")) == [ProfilerActivity.XPU, ProfilerActivity.CPU]


def test_an_accelerator_the_worker_lacks_is_refused_with_what_it_has():
    with pytest.raises(RuntimeError, match=r"cuda activity requested but this worker has no CUDA device "
                                           r"\(it has: xpu\)"):
        profiler_activities(["cpu", "cuda"], _has("xpu"))


def test_the_cpu_is_never_refused():
    assert profiler_activities(["cpu"], _has()) == [ProfilerActivity.CPU]
