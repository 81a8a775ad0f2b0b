"""Kineto's names that every reader of a trace agrees on: the device runtime's call categories and the host's
collective calls (the analysis, the merge and the export child's cut read them alike)."""

from __future__ import annotations

__all__ = ["HOST_COLLECTIVE_PREFIXES", "RUNTIME_CATEGORIES", "starts_copy"]

# A device runtime's or driver's calls (a launch, a copy, a sync, the allocator), whose correlation id ties each to the
# device work it started: CUDA's and HIP's (HIP keeps CUDA's categories), MTIA's, and an Intel GPU's (Kineto's XPU
# plugin records the SYCL/Unified Runtime's calls and Level Zero's).
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "mtia_runtime", "xpu_runtime", "xpu_driver"})
# The host's collective calls by process group: c10d's dispatcher ops and each backend's record (xccl: Intel GPUs',
# over oneCCL).
HOST_COLLECTIVE_PREFIXES = ("c10d::", "nccl:", "gloo:", "ucc:", "mpi:", "hccl:", "xccl:")


def starts_copy(cat: str, name: str) -> bool:
    """A runtime call that starts a copy: ``cudaMemcpyAsync``, ``hipMemcpyWithStream``, an Intel GPU's
    ``urEnqueueUSMMemcpy`` or Level Zero's ``zeCommandListAppendMemoryCopy``."""
    return cat in RUNTIME_CATEGORIES and ("Memcpy" in name or "MemoryCopy" in name)
