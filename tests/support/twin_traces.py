"""Real CUDA recordings rewritten in another runtime's words, to judge rayprof on devices no public trace shows it.

**Intel GPUs.** No public Kineto trace of an Intel GPU could be found to test against (only hand-made ones in other
projects' tests), so the tests take real H100 recordings and change what the device's runtime calls itself, as Kineto's
XPU plugin (``libkineto/src/plugin/xpupti``) records it over Intel's PTI: the runtime's calls are category
``xpu_runtime`` and named by the Unified Runtime (``urEnqueueKernelLaunch``, ``urEnqueueUSMMemcpy``,
``urQueueFinish``...); copies are named by PTI's kinds of memory at each end (``Memcpy M2D (MEMORY(Unknown) ->
DEVICE)``: M is malloc'd, pageable, memory, H the runtime's pinned host memory, D the device's); device work carries no
``stream`` (its ``tid`` is the SYCL queue), CUPTI's fields (``cuda_sync`` events, occupancy, the CUDA versions) are
gone, the device is listed as the plugin lists it (a name and its memory, no compute capability) and its [memory]
events carry XPU's device type.

**AMD GPUs** have real traces of their own (TraceLens', HTA's); a ROCm twin of a CUDA recording is for a case none of
those holds: Kineto over roctracer keeps CUDA's categories and names HIP's calls (``hipLaunchKernel``,
``hipStreamWaitEvent``).

Timings, ops, correlations and kernels' names are the recording's: what rayprof says of the one should be what it
says of the other, in the device's own words.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from orchestrator.traces.loader import canonical_category

__all__ = ["CUDA_TO_UR", "as_rocm_trace", "as_xpu_trace", "xpu_properties"]

# The Unified Runtime's call for each CUDA runtime or driver call the recordings hold (the rest are queries, whose
# nearest UR call is a device query).
CUDA_TO_UR = {
    "cudaLaunchKernel": "urEnqueueKernelLaunch",
    "cudaLaunchKernelExC": "urEnqueueKernelLaunch",
    "cuLaunchKernel": "urEnqueueKernelLaunch",
    "cuLaunchKernelEx": "urEnqueueKernelLaunch",
    "cudaMemcpyAsync": "urEnqueueUSMMemcpy",
    "cudaMemcpy": "urEnqueueUSMMemcpy",
    "cudaMemsetAsync": "urEnqueueUSMFill",
    "cudaStreamSynchronize": "urQueueFinish",
    "cudaDeviceSynchronize": "urQueueFinish",
    "cudaEventSynchronize": "urEventWait",
    "cudaMalloc": "urUSMDeviceAlloc",
    "cudaFree": "urUSMFree",
    "cudaHostAlloc": "urUSMHostAlloc",
    "cudaFreeHost": "urUSMFree",
    "cudaEventRecord": "urEnqueueEventsWaitWithBarrier",
    "cudaEventRecordWithFlags": "urEnqueueEventsWaitWithBarrier",
    "cudaStreamWaitEvent": "urEnqueueEventsWait",
    "cudaEventQuery": "urEventGetInfo",
}
_QUERY = "urDeviceGetInfo"
_MEMORY = {"Pageable": ("M", "MEMORY(Unknown)"), "Pinned": ("H", "HOST"), "Device": ("D", "DEVICE")}
_CUPTI_ARGS = ("stream", "context", "queued", "registers per thread", "shared memory", "blocks per SM",
               "warps per SM", "grid", "block", "est. achieved occupancy %")
_CUPTI_HEADER = ("deviceProperties", "cuda_driver_version", "cuda_runtime_version", "cupti_version")
_XPU = 12  # c10::DeviceType's XPU, as [memory] events carry it (CUDA's is 1)


def xpu_properties(device_id: int, total_bytes: int) -> dict[str, Any]:
    """One device as the XPU plugin lists it (``getXpuDeviceProperties``: SYCL's device info, no compute capability)."""
    return {
        "id": device_id, "name": "Intel(R) Data Center GPU Max 1550", "totalGlobalMem": total_bytes,
        "maxComputeUnits": 448, "maxWorkGroupSize": 1024, "maxClockFrequency": 1600, "maxMemAllocSize": total_bytes,
        "localMemSize": 131072, "vendor": "Intel(R) Corporation", "driverVersion": "1.6.31294",
    }


def _copy_name(name: str) -> str:
    """``Memcpy HtoD (Pageable -> Device)`` -> ``Memcpy M2D (MEMORY(Unknown) -> DEVICE)``."""
    src, _, dst = name.partition("(")[2].rstrip(")").partition(" -> ")
    (s, s_word), (d, d_word) = _MEMORY[src], _MEMORY[dst]
    return f"Memcpy {s}2{d} ({s_word} -> {d_word})"


def _event(e: dict[str, Any]) -> dict[str, Any] | None:
    cat = canonical_category(e.get("cat", "")) if isinstance(e.get("cat"), str) else None  # PyTorch 1.8's "Runtime"
    if cat == "cuda_sync":
        return None
    e = dict(e)
    if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1:
        e["args"] = {**e["args"], "Device Type": _XPU}
    if cat in ("cuda_runtime", "cuda_driver"):
        e["cat"], e["name"] = "xpu_runtime", CUDA_TO_UR.get(e["name"], _QUERY)
    elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        args = {k: v for k, v in e.get("args", {}).items() if k not in _CUPTI_ARGS}
        e["args"] = {**args, "sycl queue": e.get("tid"), "l0 queue": "0x000055d08b8fc138"}
        e["cat"] = cat
        if cat == "gpu_memcpy" and "(" in e["name"]:  # PyTorch 1.8 named no memory kinds ("Memcpy HtoD"): kept
            e["name"] = _copy_name(e["name"])
        elif cat == "gpu_memset":
            e["name"] = "Memset (DEVICE)"
    return e


def _read(cuda_trace: Path) -> dict[str, Any]:
    opener = gzip.open if cuda_trace.suffix == ".gz" else open
    with opener(cuda_trace, "rt") as f:
        trace: dict[str, Any] = json.load(f)
    return trace


def _write(trace: dict[str, Any], cuda_trace: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / cuda_trace.name.removesuffix(".gz")
    out.write_text(json.dumps(trace))
    return out


def as_xpu_trace(cuda_trace: Path, out_dir: Path) -> Path:
    """Write ``cuda_trace`` (a Kineto JSON, gzipped or not) into ``out_dir`` as the XPU plugin would have; its path."""
    trace = _read(cuda_trace)
    events = [x for x in map(_event, trace["traceEvents"]) if x is not None]
    header = {k: v for k, v in trace.items() if k != "traceEvents" and k not in _CUPTI_HEADER}
    header["deviceProperties"] = [xpu_properties(d["id"], d["totalGlobalMem"]) for d in trace.get("deviceProperties", [])]
    return _write({**header, "traceEvents": events}, cuda_trace, out_dir)


def _hip_name(name: str) -> str:
    """CUDA's runtime and driver calls as HIP names them: cudaStreamWaitEvent -> hipStreamWaitEvent, cuLaunchKernel ->
    hipModuleLaunchKernel."""
    if name.startswith("cuda"):
        return "hip" + name[4:]
    return "hipModule" + name[2:] if name.startswith("cuLaunch") else "hip" + name[2:]


def as_rocm_trace(cuda_trace: Path, out_dir: Path) -> Path:
    """Write ``cuda_trace`` into ``out_dir`` as Kineto over roctracer would have on an AMD GPU; its path."""
    trace = _read(cuda_trace)
    events = []
    for e in trace["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            e = {**e, "name": _hip_name(e["name"])}
        events.append(e)
    header = {k: v for k, v in trace.items() if k != "traceEvents" and k not in _CUPTI_HEADER}
    header["deviceProperties"] = [{**d, "name": "AMD Instinct MI300X"} for d in trace.get("deviceProperties", [])]
    return _write({**header, "traceEvents": events}, cuda_trace, out_dir)
