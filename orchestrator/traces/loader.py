"""Load one rank's trace into compact, typed form (the files were found by
:mod:`orchestrator.traces.discover`).

:func:`load_rank` streams one file (msgspec-typed, see
  :mod:`orchestrator.traces.stream`) and keeps only what the analysis needs:
  spans of a few categories (and a ``with_stack`` trace's longer Python frames), memory peaks, device properties, and what kind of
  trace it is (device, schedule, PyTorch 1.8/1.9 category names).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, sub
from typing import Any, Literal

import msgspec

from orchestrator.layout import MAX_STEP_DIGITS
from orchestrator.traces.categories import RUNTIME_CATEGORIES, XPU_RUNTIME_CATEGORIES
from orchestrator.traces.discover import TraceFile
from orchestrator.traces.stream import TraceParseError, TraceReader

__all__ = [
    "LEGACY_CATEGORIES",
    "PYTHON_FRAME",
    "TIME_RANGE_US",
    "BatchHook",
    "Device",
    "RankTrace",
    "Span",
    "canonical_category",
    "comm_group",
    "load_rank",
    "parse_group_ranks",
]

Device = Literal["cuda", "rocm", "mtia", "xpu", "cpu"]
# The largest process group a collective's args may name (the largest training jobs have ~10^5 ranks).
MAX_GROUP_SIZE = 1 << 20

# PyTorch 1.8/1.9 (and the TensorBoard plugin's samples) wrote these category names;
# the plugin matched them case-insensitively, and so do we.
LEGACY_CATEGORIES = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python": "python_function",
    "memory": "cpu_instant_event",
}
# Span categories the analysis reads; anything else (flows, instants, short python frames) is skipped at load
# time to keep a rank's footprint small.
_KEPT_CATEGORIES = frozenset(
    {"cpu_op", "user_annotation", "cuda_sync", "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "mtia_ccp_events"}
) | RUNTIME_CATEGORIES
# Python frames kept all the same: module forwards, and torch.cuda.graph's set-up around a capture (its sync,
# gc.collect and empty_cache: the capture's cost). The DataLoader's _next_data is kept by name below.
_KEPT_PYTHON = ("nn.Module:", "torch/cuda/graphs.py(")
PYTHON_FRAME = "python_frame"
"""The category of the other Python frames of a ``with_stack`` trace that are kept: only to name the Python the host
runs outside any op (:mod:`orchestrator.analysis.python_frames`), never a host span of their own."""
# A frame shorter than this names too little idle time to keep (a with_stack trace holds millions of them); its time
# is named by the frame that called it. Builtins (``<built-in method ...>``) name no code of the user's.
PYTHON_FRAME_MIN_US = 50.0
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"})
_TS, _END = attrgetter("ts"), attrgetter("end")
# About 3,000 years in µs: wall-clock µs since 1970 (old Kineto) stay far inside it.
TIME_RANGE_US = 1e17
# No span of a profiling window lasts a week; a longer one (or a negative one) is not a measurement.
MAX_SPAN_US = 7 * 86_400e6
_ROCM_HEADER_KEYS = ("roctracer_version", "hip_runtime_version", "hip_driver_version", "rocprofiler_version")


def canonical_category(cat: str) -> str:
    """Today's Kineto name for a category (``Operator`` -> ``cpu_op``); unknown names unchanged."""
    return LEGACY_CATEGORIES.get(cat.lower(), cat) if cat not in _KEPT_CATEGORIES else cat


class Span(msgspec.Struct, frozen=True, gc=False):
    """A complete ("X") event, in µs on the trace's own clock (relative to its base time).

    A frozen msgspec Struct rather than a dataclass: it builds in a sixth of
    the time (0.4 vs 2.4 µs measured), which is most of a rank's load time.

    ``cat`` is today's Kineto name even in a PyTorch 1.8/1.9 trace.
    ``external_id`` links a CPU op to the launches and kernels it caused;
    ``stream`` and ``device`` are set on device spans (kernels, copies, memsets).
    """

    ts: float
    end: float
    name: str
    cat: str
    pid: Any
    tid: Any
    correlation: int | None = None
    args: dict[str, Any] | None = None
    external_id: int | None = None
    stream: int | None = None
    device: int | None = None


@dataclass(slots=True)
class RankTrace:
    """One rank's trace reduced to what the analysis reads."""

    file: TraceFile
    spans: list[Span] = field(default_factory=list)
    # (device type, device id) -> peak "Total Allocated" bytes seen in [memory] events.
    memory_peaks: dict[tuple[int, int], int] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    # The accelerator whose work the trace recorded; "cpu" when it holds no device activity.
    device: Device = "cpu"
    # A "cpu" trace that holds a GPU runtime's calls (CUPTI's range profiler, device tracing off or failed): that runtime.
    unrecorded: Literal["cuda", "rocm", "xpu"] | None = None
    # Whether any ProfilerStep#N span exists; without one the trace is a single window.
    has_profiler_steps: bool = False
    # When the profiler recorded: its own ``PyTorch Profiler (N)`` spans (category ``Trace``), first start to last end;
    # None where the trace has none.
    recorded: tuple[float, float] | None = None
    # Old category names found and what they were read as, e.g. {"Operator": "cpu_op"}.
    category_aliases: dict[str, str] = field(default_factory=dict)
    # Top-level keys other than traceEvents and deviceProperties (distributedInfo, versions...).
    header: dict[str, Any] = field(default_factory=dict)
    # Trace events read, and bytes of (uncompressed) JSON they came in.
    events: int = 0
    raw_bytes: int = 0


class _Args(msgspec.Struct):
    # ROCm's runtime events write stream "0x0" and bytes "128": read those as absent.
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    bytes: int | str | None = None
    stream: int | str | None = None
    device: int | str | None = None
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    # A collective kernel's process group (PyTorch 2.2+ copies these from record_param_comms onto the kernel).
    # Any type is accepted here: a group a trace writes oddly is left out (comm_group), never a reason to reject it.
    group_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_desc: Any = msgspec.field(default=None, name="Process Group Description")
    group_size: Any = msgspec.field(default=None, name="Group size")
    elements: Any = msgspec.field(default=None, name="In msg nelems")
    # The collective a kernel runs ("allreduce", "_allgather_base", "all_to_allv", "send"): NCCL's generic kernel
    # (ncclDevKernel_Generic) does not say it by its name.
    collective: Any = msgspec.field(default=None, name="Collective name")


class _Event(msgspec.Struct):
    """The fields of a trace event the loader and the merge's scan read; a field of another type rejects the trace.

    ``args`` stays raw here: the scan needs its length, and a batch's args are then
    decoded as :class:`_Args` in one call (as fast as decoding them inside the event).
    """

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw()


_ARGS = msgspec.json.Decoder(list[_Args | None])
_AT_INDEX = re.compile(r"`\$\[(\d+)\]")
BatchHook = Callable[[list[Any]], None]


def _decode_args(batch: list[_Event], first: int) -> list[_Args | None]:
    """Each event's args (None where it has none), in one decode; ``first`` is the batch's first event's index."""
    try:
        return _ARGS.decode(b"".join((b"[", b",".join([e.args or b"null" for e in batch]), b"]")))
    except RecursionError:
        raise TraceParseError(f"args nested too deep in events {first}-{first + len(batch) - 1}") from None
    except msgspec.DecodeError as exc:
        raise TraceParseError(_AT_INDEX.sub(lambda m: f"`event {first + int(m.group(1))}: $.args", str(exc))) from None


def comm_group(name: Any, ranks: Any, description: Any, size: Any, elements: Any) -> dict[str, Any] | None:
    """A collective kernel's process group as the analysis keys it: ``group`` (the group's name, the same on every
    member; its member list where the trace has no name), ``group_desc``, ``group_size``, ``elements``.

    None when the trace names no usable group. ``Process Group Ranks`` is a string, ``"[0, 1]"``; a list of ints is
    read too. Only a group whose size is known can be judged against its members (groups.py), so one without is left out.
    """
    members = parse_group_ranks(ranks)
    if size.__class__ is not int:
        size = len(members) if members else None
    key = name if name.__class__ is str and name else (",".join(map(str, members)) if members else None)
    if key is None or size is None or not 0 < size <= MAX_GROUP_SIZE:
        return None
    return {
        "group": key,
        "group_desc": description if description.__class__ is str else "",
        "group_size": size,
        "elements": elements if elements.__class__ is int and elements >= 0 else 0,
    }


def parse_group_ranks(value: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` (or ``[0, 1, 2]``) as a tuple of global ranks; None for anything else, ``"[]"`` included."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")) or len(text) > 16 * MAX_GROUP_SIZE:
            return None
        parts = [p.strip() for p in text[1:-1].split(",")]
        if not all(p.isascii() and p.isdigit() for p in parts):
            return None
        value = [int(p) for p in parts]
    if isinstance(value, list) and value and len(value) <= MAX_GROUP_SIZE and all(v.__class__ is int and v >= 0 for v in value):
        return tuple(value)
    return None


def _detect_device(out: RankTrace, categories: set[str], names: dict[str, str]) -> Device:
    if any(cat.startswith("mtia") for cat in categories):
        return "mtia"
    if not categories & _DEVICE_CATEGORIES:
        return "cpu"
    if categories & XPU_RUNTIME_CATEGORIES:  # an Intel GPU's kernels, copies and fills have CUDA's categories
        return "xpu"
    amd = any("AMD" in str(d.get("name", "")) for d in out.device_properties)
    if amd or any(key in out.header for key in _ROCM_HEADER_KEYS):
        return "rocm"
    if _hip_named(names):
        return "rocm"
    return "cuda"


def _hip_named(names: dict[str, str]) -> bool:
    return any(name.startswith("hip") and name[3:4].isupper() for name in names)  # hipLaunchKernel, hipMemcpy...


def _check_spans(spans: list[Span], names: dict[str, str]) -> None:
    """Refuse what no profiler measured: a span of negative length or longer than :data:`MAX_SPAN_US`,
    a step numbered past ``MAX_STEP_DIGITS`` digits (it would be analysed as a measurement, or fail later)."""
    if spans:
        lengths = list(map(sub, map(_END, spans), map(_TS, spans)))
        if min(lengths) < 0:
            raise TraceParseError(f"a span of negative duration ({min(lengths):.6g} µs): not a measurement")
        if max(lengths) > MAX_SPAN_US:
            raise TraceParseError(f"a span of {max(lengths):.3g} µs (over {MAX_SPAN_US / 86_400e6:.0f} days): not a measurement")
    for name in names:
        digits = name[len("ProfilerStep#") :] if name.startswith("ProfilerStep#") else ""
        if len(digits) > MAX_STEP_DIGITS and digits.isdigit():
            raise TraceParseError(f"ProfilerStep#<{len(digits)} digits>: not a step number")


def _recorded(out: RankTrace, ts: float, end: float) -> None:
    """Widen the trace's recorded span by one of the profiler's own spans."""
    out.recorded = (ts, end) if out.recorded is None else (min(out.recorded[0], ts), max(out.recorded[1], end))


def load_rank(trace: TraceFile, on_batch: BatchHook | None = None) -> RankTrace:
    """Stream one rank's trace and keep spans, memory peaks, device properties and its kind.

    ``on_batch`` sees every batch of decoded events (:class:`_Event`, args raw)
    before it is reduced: the merge's scan rides on this read instead of making its own.

    Raises :class:`~orchestrator.traces.stream.TraceParseError` when the file
    is damaged anywhere or a field the analysis reads has the wrong type (a
    list for ``name`` or ``args``, a string ``Device Type``, NaN, an integer
    beyond 64 bits): a truncated or garbled trace would silently understate
    the last steps, so the analysis rejects it instead.
    """
    out = RankTrace(file=trace)
    names: dict[str, str] = {}
    categories: dict[str, str] = {}
    spans = out.spans
    append = spans.append
    reader = TraceReader(trace.path, _Event)
    events_before = 0
    for kind, key, value in reader:
        if kind == "key":
            if key == "deviceProperties" and isinstance(value, list):
                out.device_properties = [d for d in value if isinstance(d, dict)]
            elif key != "deviceProperties":
                out.header[key] = value
            continue
        if on_batch is not None:
            on_batch(value)
        for event, args in zip(value, _decode_args(value, events_before), strict=True):
            ph = event.ph
            if ph == "X":
                cat = categories.get(event.cat)
                if cat is None:
                    cat = categories[event.cat] = sys.intern(canonical_category(event.cat))
                name = event.name
                if cat not in _KEPT_CATEGORIES:
                    if cat == "Trace" and event.ts is not None and name.startswith("PyTorch Profiler"):
                        _recorded(out, event.ts, event.ts + event.dur)
                    if cat != "python_function":
                        continue
                    if not (name.startswith(_KEPT_PYTHON) or "_next_data" in name):
                        if event.dur < PYTHON_FRAME_MIN_US or name.startswith("<"):
                            continue
                        cat = PYTHON_FRAME
                ts = event.ts
                if ts is None:
                    continue
                # Many spans share a few names: intern them to keep a big rank small.
                interned = names.get(name)
                name = interned if interned is not None else names.setdefault(name, sys.intern(name))
                if args is None:
                    append(Span(ts, ts + event.dur, name, cat, event.pid, event.tid))
                    continue
                copied, stream, device = args.bytes, args.stream, args.device
                kept_args = {"bytes": copied} if cat == "gpu_memcpy" and copied.__class__ is int else None
                if cat == "kernel" and (args.group_name is not None or args.group_ranks is not None):
                    kept_args = comm_group(args.group_name, args.group_ranks, args.group_desc, args.group_size, args.elements)
                if cat == "kernel" and args.collective.__class__ is str:
                    kept_args = {**(kept_args or {}), "collective": args.collective}
                append(
                    Span(
                        ts, ts + event.dur, name, cat, event.pid, event.tid, args.correlation, kept_args,
                        args.external_id, stream if stream.__class__ is int else None,
                        device if device.__class__ is int else None,
                    )
                )
            elif ph == "i" and event.name == "[memory]" and args is not None:
                if args.total_allocated is not None:
                    device = (args.device_type or 0, -1 if args.device_id is None else args.device_id)
                    if args.total_allocated > out.memory_peaks.get(device, -1):
                        out.memory_peaks[device] = args.total_allocated
        events_before += len(value)
    out.raw_bytes, out.events = reader.bytes_read, reader.events
    if not reader.has_events:
        keys = ", ".join(list(out.header)[:5])
        raise TraceParseError(f"no traceEvents: not a Kineto trace (its keys: {keys or 'none'})")
    if spans and not (TIME_RANGE_US > max(map(_END, spans)) and min(map(_TS, spans)) > -TIME_RANGE_US):
        # JSON has no NaN or Infinity, but 1e308 is a number: refuse times no clock wrote.
        raise TraceParseError(f"timestamps beyond ±{TIME_RANGE_US:.0e} µs: not a trace any clock wrote")
    _check_spans(spans, names)
    out.category_aliases = {old: new for old, new in categories.items() if old != new}
    seen = set(categories.values())
    out.device = _detect_device(out, seen, names)
    if out.device == "cpu" and {"cuda_runtime", "cuda_driver"} & seen:
        out.unrecorded = "rocm" if _hip_named(names) else "cuda"
    elif out.device == "cpu" and XPU_RUNTIME_CATEGORIES & seen:
        out.unrecorded = "xpu"
    out.has_profiler_steps = any(name.startswith("ProfilerStep#") for name in names)
    # Two stable C-keyed sorts give (ts ascending, end descending): parents before their children.
    spans.sort(key=_END, reverse=True)
    spans.sort(key=_TS)
    return out
