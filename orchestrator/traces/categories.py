"""Kineto's names that every reader of a trace agrees on: the device runtime's call categories, the host's collective
calls and the devices' types (the analysis, the merge and the export child read them alike)."""

from __future__ import annotations

__all__ = [
    "CPU_DEVICE_TYPE",
    "CUDA_DEVICE_TYPE",
    "FUNCTIONAL_COLLECTIVE_PREFIXES",
    "HOST_COLLECTIVE_PREFIXES",
    "RUNTIME_CATEGORIES",
    "XPU_DEVICE_TYPE",
    "XPU_RUNTIME_CATEGORIES",
    "device_label",
    "starts_copy",
]

# A device runtime's or driver's calls (a launch, a copy, a sync, the allocator), whose correlation id ties each to the
# device work it started: CUDA's and HIP's (HIP keeps CUDA's categories), MTIA's, and an Intel GPU's (Kineto's XPU
# plugin records the SYCL/Unified Runtime's calls and Level Zero's).
XPU_RUNTIME_CATEGORIES = frozenset({"xpu_runtime", "xpu_driver"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "mtia_runtime"}) | XPU_RUNTIME_CATEGORIES
# The host's collective calls by process group: c10d's dispatcher ops and each backend's record (xccl: Intel GPUs',
# over oneCCL), and the functional collectives DTensor (tensor parallelism) and torch.compile'd graphs issue, with the
# wait_tensor that blocks on each (torch 2.3+ names them _c10d_functional, 2.1-2.2 c10d_functional).
FUNCTIONAL_COLLECTIVE_PREFIXES = ("_c10d_functional::", "_c10d_functional_autograd::", "c10d_functional::")
HOST_COLLECTIVE_PREFIXES = ("c10d::", "nccl:", "gloo:", "ucc:", "mpi:", "hccl:", "xccl:", *FUNCTIONAL_COLLECTIVE_PREFIXES)


def starts_copy(cat: str, name: str) -> bool:
    """A runtime call that starts a copy: ``cudaMemcpyAsync``, ``hipMemcpyWithStream``, an Intel GPU's
    ``urEnqueueUSMMemcpy`` or Level Zero's ``zeCommandListAppendMemoryCopy``."""
    return cat in RUNTIME_CATEGORIES and ("Memcpy" in name or "MemoryCopy" in name)


# c10::DeviceType's numbers, as a [memory] event's "Device Type" carries them, by torch's names (ROCm's HIP devices
# report CUDA's).
CPU_DEVICE_TYPE, CUDA_DEVICE_TYPE, XPU_DEVICE_TYPE = 0, 1, 12
_DEVICE_TYPES = {CPU_DEVICE_TYPE: "cpu", CUDA_DEVICE_TYPE: "cuda", XPU_DEVICE_TYPE: "xpu", 15: "hpu", 19: "mtia"}


def device_label(device_type: object, device_id: int) -> str:
    """A [memory] event's device as torch names it: ``cuda:0``, ``xpu:0``, ``cpu:-1``; ``type20:0`` for a type
    torch has no common name for, and the CPU for a type that is no number."""
    kind = _DEVICE_TYPES.get(device_type) if device_type.__class__ is int else "cpu"
    return f"{kind or f'type{device_type}'}:{device_id}"
