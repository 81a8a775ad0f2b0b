"""Devices no public trace shows rayprof: Intel GPUs (torch.xpu), judged as their CUDA twins are and told in their own
runtime's words; and an AMD GPU's twin where no real ROCm trace holds the case.

The twins are real recordings rewritten as the XPU plugin (or roctracer) writes (``tests/support/twin_traces.py`` says
what changes and why): two H100 recordings of a DataLoader-bound step and its fix (``../shared/gpu-traces``), the
profiler tutorial's ``MASK INDICES`` round trip and a loop that frees and allocates device memory every step
(``tests/data/traces``), and every shared external trace recorded on NVIDIA GPUs.
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.export.tables import MemoryTimeline
from orchestrator.analysis import Summary, analyze_folder
from orchestrator.analysis.copies import copy_kind
from orchestrator.analysis.spans import is_comm, is_comm_kernel_name, is_copy_call, is_runtime, is_sync
from orchestrator.traces.categories import device_label
from orchestrator.traces.loader import Span
from tests.support.realtraces import external, finding, h100
from tests.support.tracefiles import shared, write_trace
from tests.support.twin_traces import as_rocm_trace, as_xpu_trace, xpu_properties

_DATA = Path(__file__).parents[1] / "data" / "traces"
_FOLDERS = {
    "seed003_before": lambda: shared("gpu-traces", "seed003_before"),
    "seed003_after": lambda: shared("gpu-traces", "seed003_after"),
    "h100_mask_indices": lambda: _DATA / "h100_mask_indices" / "traces",
    "h100_allocator": lambda: _DATA / "h100_allocator" / "traces",
}
# Every shared external trace recorded on NVIDIA GPUs (HTA's, PARAM's, the TensorBoard plugin's; the AMD and MTIA ones
# and the CPU-only one are their own devices): among them one of 16 A100 ranks whose queued work waits on other
# streams, PARAM's 8 V100 ranks with one late, a V100 busy 80% of its step in fp32 matrix math, PyTorch 1.8's traces.
_EXTERNAL_CUDA = (
    "hta_alexnet_no_profilerstep", "hta_df_index_resolver_v100_r1of2", "hta_nccl_parser_a100_r0of2",
    "hta_negative_queue_a100_r0of16", "hta_ns_resolution_v100_1rank", "hta_trace_diff_control_a100_r3of8",
    "hta_trace_diff_test_v100_r1of2", "hta_trace_filter_2of128", "param_dlrm_v100_8ranks", "param_resnet_no_profilerstep",
    "tbplugin_resnet50_nw0_a", "tbplugin_resnet50_nw0_b", "tbplugin_resnet50_nw4_a", "tbplugin_resnet50_nw4_b",
)
_FOLDERS.update({case: functools.partial(shared, "external-traces", case, "traces") for case in _EXTERNAL_CUDA})
# What only CUDA has, or names: its runtime's calls and module, its allocator's setting, CUPTI, its graphs.
_CUDA_WORDS = re.compile(r"torch\.cuda|CUDA|cuda[A-Z]|'cuda'|cu[A-Z][a-z]+\(|PYTORCH_CUDA|CUPTI|cuDNN|Ampere")
_TWINS: dict[str, tuple[Summary, Summary]] = {}


@pytest.fixture
def twins(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Summary, Summary]]:
    """A case's analysis as recorded, and of its XPU twin (every rank's file rewritten); once per case."""

    def get(case: str) -> tuple[Summary, Summary]:
        if case not in _TWINS:
            folder, out = _FOLDERS[case](), tmp_path_factory.mktemp(case)
            for trace in sorted(folder.glob("*.pt.trace.json*")):
                as_xpu_trace(trace, out)
            # The recordings' own analyses are the session's (realtraces caches them for every test that reads them).
            recorded = external(case) if case in _EXTERNAL_CUDA else h100(case) if case.startswith("seed") else None
            _TWINS[case] = (recorded or analyze_folder(folder), analyze_folder(out))
        return _TWINS[case]

    return get


@pytest.mark.parametrize("case", list(_FOLDERS))
def test_an_intel_gpu_recording_is_read_as_an_xpu_device(case, twins):
    cuda, xpu = twins(case)
    assert [r.device for r in xpu.ranks] == ["xpu"] * len(cuda.ranks)


@pytest.mark.parametrize("case", list(_FOLDERS))
def test_an_intel_gpu_recording_gets_the_findings_its_cuda_twin_gets_with_the_same_savings(case, twins):
    cuda, xpu = twins(case)
    assert [(f.code, f.severity) for f in xpu.findings] == [(f.code, f.severity) for f in cuda.findings]
    assert [f.max_saving_ms for f in xpu.findings] == pytest.approx([f.max_saving_ms for f in cuda.findings], rel=1e-6)


@pytest.mark.parametrize("case", list(_FOLDERS))
def test_an_intel_gpu_recording_splits_its_idle_time_by_cause_as_its_cuda_twin(case, twins):
    cuda, xpu = twins(case)
    for c, x in zip(cuda.ranks, xpu.ranks, strict=True):
        assert [s.idle_ms for s in x.steps] == [pytest.approx(s.idle_ms, rel=1e-6) for s in c.steps]


@pytest.mark.parametrize("case", list(_FOLDERS))
def test_an_intel_gpu_recording_splits_its_steps_into_phases_as_its_cuda_twin(case, twins):
    # The host's waits in the runtime (urQueueFinish for cudaStreamSynchronize) are the sync phase's on both.
    cuda, xpu = twins(case)
    for c, x in zip(cuda.ranks, xpu.ranks, strict=True):
        assert x.mean_phases.model_dump() == pytest.approx(c.mean_phases.model_dump(), rel=1e-6)


@pytest.mark.parametrize("case", list(_FOLDERS))
def test_what_rayprof_tells_of_an_intel_gpu_names_nothing_only_cuda_has(case, twins):
    _, xpu = twins(case)
    said = [text for f in xpu.findings for text in (f.title, f.evidence, f.fix)]
    # Kernels are named as recorded: a CUDA kernel's name (at::native::CUDAFunctor_add) is the recording's, not rayprof's.
    said = [re.sub(r"at::native::CUDAFunctor\w*", "", text) for text in said]
    assert [m.group() for text in said for m in _CUDA_WORDS.finditer(text)] == []


def test_the_allocator_s_calls_on_an_intel_gpu_are_named_and_its_fix_is_torch_xpu_s(twins):
    _, xpu = twins("h100_allocator")
    fix = finding(xpu, "low_gpu_utilization").fix
    assert fix.startswith("urUSMFree, urUSMDeviceAlloc leave the device idle 1.9 ms per step")
    assert "no torch.xpu.empty_cache() in the loop" in fix


def test_pageable_copies_on_an_intel_gpu_are_told_as_the_round_trip_they_are(twins):
    _, xpu = twins("h100_mask_indices")
    copies = finding(xpu, "htod_copy")
    assert copies.title == "Copies to and from pageable memory cost 26% of the step"
    assert copies.fix.startswith("The region 'MASK INDICES' copies to the host and back (87.7 ms of pageable copies")


def test_the_fused_optimizer_is_told_on_an_intel_gpu_which_has_fused_kernels(twins):
    _, xpu = twins("seed003_after")
    fix = finding(xpu, "low_gpu_utilization").fix
    assert "torch.optim.Adam(params, fused=True)): one kernel launch per parameter group in place of its foreach ops;" in fix


def test_a_trace_of_xpu_runtime_calls_without_device_activity_says_the_device_went_unrecorded(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#3", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 100, "dur": 500, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "xpu_runtime", "name": "urEventWait", "ts": 110, "dur": 480, "pid": 1, "tid": 1},
    ]
    summary = analyze_folder(write_trace(tmp_path / "rank0.pt.trace.json", events, rank=0, world_size=1).parent)
    (rank,) = summary.ranks
    assert (rank.device, rank.unrecorded_device) == ("cpu", "xpu")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Memcpy M2D (MEMORY(Unknown) -> DEVICE)", ("HtoD", "pageable")),
        ("Memcpy H2D (HOST -> DEVICE)", ("HtoD", "pinned")),
        ("Memcpy D2M (DEVICE -> MEMORY(Unknown))", ("DtoH", "pageable")),
        ("Memcpy D2H (DEVICE -> HOST)", ("DtoH", "pinned")),
        ("Memcpy D2D (DEVICE -> DEVICE)", ("DtoD", None)),
        ("Memcpy M2H (MEMORY(Unknown) -> HOST)", ("HtoH", None)),
        ("Memcpy S2D (SHARED -> DEVICE)", ("other", None)),
    ],
)
def test_an_xpu_copy_s_direction_and_host_memory_are_read_from_pti_s_kinds_of_memory(name, kind):
    assert copy_kind(Span(0.0, 1.0, name, "gpu_memcpy", 0, 0)) == kind


@given(st.text(max_size=60))
def test_any_copy_name_reads_as_a_direction_or_other_and_never_fails(name):
    direction, memory = copy_kind(Span(0.0, 1.0, name, "gpu_memcpy", 0, 0))
    assert direction in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other")
    assert memory in ("pageable", "pinned", None)


def test_an_intel_gpu_s_collectives_are_collectives_on_the_host_and_on_the_device():
    # The host's record is XCCL's profiling title; the kernel's name is oneCCL's (torch-xpu-ops#5384, a Max 1550's).
    assert is_comm(Span(0.0, 1.0, "xccl:all_reduce", "user_annotation", 1, 1))
    assert is_comm_kernel_name("oneccl_reduce_base<float, 2, 16, 1, 1, 2>")


@pytest.mark.parametrize("name", ["urQueueFinish", "urEventWait", "zeEventHostSynchronize", "piQueueFinish"])
def test_the_sycl_runtime_s_waits_are_waits_and_its_calls_are_runtime_calls(name):
    span = Span(0.0, 1.0, name, "xpu_runtime", 1, 1)
    assert is_sync(span) and is_runtime(span)


@pytest.mark.parametrize(
    ("cat", "name"), [("xpu_runtime", "urEnqueueUSMMemcpy"), ("xpu_driver", "zeCommandListAppendMemoryCopy")]
)
def test_the_sycl_runtime_s_and_level_zero_s_copy_calls_start_copies(cat, name):
    assert is_copy_call(Span(0.0, 1.0, name, cat, 1, 1))


def _memory_event(ts: float, device_type: int, device_id: int, allocated: int) -> dict:
    return {"ph": "i", "s": "t", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Device Type": device_type, "Device Id": device_id, "Total Allocated": allocated,
                     "Total Reserved": 2 * allocated, "Bytes": allocated}}


_MEMORY_EVENTS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
    _memory_event(10, 0, -1, 4096),  # the host's
    _memory_event(20, 12, 0, 1 << 20),  # c10::DeviceType's XPU, device 0
    _memory_event(30, 12, 0, 1 << 21),
]


def test_an_intel_gpu_s_memory_peak_is_its_own_device_not_the_host_s(tmp_path):
    summary = analyze_folder(write_trace(tmp_path / "rank0.pt.trace.json", _MEMORY_EVENTS, rank=0, world_size=1).parent)
    (rank,) = summary.ranks
    assert {m.device: m.peak_bytes for m in rank.memory} == {"cpu": 4096, "xpu:0": 1 << 21}


def test_an_intel_gpu_s_memory_timeline_is_a_series_of_its_own():
    timeline = MemoryTimeline()
    for event in _MEMORY_EVENTS:
        timeline.add(event)
    out = io.StringIO()
    timeline.write(out, None)
    devices = json.loads(out.getvalue())["devices"]
    assert sorted(devices) == ["cpu:-1", "xpu:0"]
    assert devices["xpu:0"]["peak_allocated_bytes"] == 1 << 21


@pytest.mark.parametrize(
    ("device_type", "device_id", "label"),
    [(0, -1, "cpu:-1"), (1, 0, "cuda:0"), (12, 1, "xpu:1"), (19, 0, "mtia:0"), (20, 0, "type20:0"), ("cuda", 0, "cpu:0")],
)
def test_a_memory_event_s_device_is_named_as_torch_names_it(device_type, device_id, label):
    assert device_label(device_type, device_id) == label


def test_an_intel_gpu_near_its_memory_is_warned_of_in_torch_xpu_s_words(tmp_path):
    total = 1 << 22  # the device as the XPU plugin lists it: 4 MiB, 2 MiB of it allocated at the peak
    launch = {"ph": "X", "cat": "xpu_runtime", "name": "urEnqueueKernelLaunch", "ts": 45, "dur": 2, "pid": 1, "tid": 1,
              "args": {"correlation": 7}}
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "ts": 50, "dur": 10, "pid": 0, "tid": 0,
              "args": {"correlation": 7, "device": 0, "sycl queue": 0}}
    events = [*_MEMORY_EVENTS, _memory_event(40, 12, 0, int(0.95 * total)), launch, kernel]
    folder = write_trace(
        tmp_path / "rank0.pt.trace.json", events, rank=0, world_size=1, deviceProperties=[xpu_properties(0, total)]
    ).parent
    found = finding(analyze_folder(folder), "memory_peak")
    assert found.title == "Memory peaks at 95% of xpu:0"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in found.fix


def test_an_amd_gpu_s_queued_work_is_told_to_look_for_hip_s_stream_waits(tmp_path):
    # Kineto over roctracer names HIP's calls; the fix names the one the job's runtime makes.
    # HTA's sampled 128-rank trace (two ranks of it): queued work behind stream waits most of its idle time.
    for trace in _FOLDERS["hta_trace_filter_2of128"]().glob("*.pt.trace.json*"):
        as_rocm_trace(trace, tmp_path)
    summary = analyze_folder(tmp_path)
    assert [r.device for r in summary.ranks] == ["rocm", "rocm"]
    fix = finding(summary, "low_gpu_utilization").fix
    assert "look for cross-stream waits (hipStreamWaitEvent, record_stream)" in fix
