"""Device-side statistics of one rank: busy time, collectives, copies.

Two views of the same device spans:

* per analysed window (a ``ProfilerStep#N``, or the whole trace when it has
  none): busy time, kernel time, collective time and how much of it no
  compute kernel hides. These feed the per-step breakdown and the findings.
* over the device's *active span* (first device event to last, of the events
  launched inside the analysed windows but the last): busy, compute and idle shares and
  the communication/computation overlap, defined as Holistic Trace Analysis
  defines them (``get_temporal_breakdown``, ``get_comm_comp_overlap``), so the
  two tools can be checked against each other.

Copies are split by direction (HtoD, DtoH, DtoD...) and host memory kind
(pageable, pinned), from the device copy's name, because each has its own cause
and fix: a pageable upload blocks the host, a download makes the host wait for
the device, a device-to-device copy never involves the host.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from orchestrator.analysis.copies import CopyKind, copy_kind
from orchestrator.analysis.intervals import (
    Intervals,
    by_time,
    clip,
    cover,
    intersect,
    membership,
    subtract,
    total,
    union,
)
from orchestrator.analysis.spans import (
    by_kind,
    collective_kind,
    is_comm_kernel,
    is_compute_kernel,
    is_region,
    site,
    where,
)
from orchestrator.layout import parse_profiler_step
from orchestrator.models.analysis import CollectiveKind, CopyStats, GpuStats, MemoryPeak, OpStat, ProcessGroupComm
from orchestrator.traces.categories import CPU_DEVICE_TYPE, CUDA_DEVICE_TYPE, XPU_DEVICE_TYPE, device_label
from orchestrator.traces.loader import RankTrace, Span

__all__ = ["DeviceView", "WindowGpu", "copy_issuer", "memory_peaks"]

Window = tuple[float, float]


class WindowGpu:
    """Device time inside one analysed window, in µs."""

    __slots__ = ("busy", "comm", "exposed", "kernel")

    def __init__(self, busy: float, kernel: float, comm: float, exposed: float) -> None:
        self.busy, self.kernel, self.comm, self.exposed = busy, kernel, comm, exposed


class DeviceView:
    """One rank's device spans, indexed for per-window and whole-span questions."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = list(spans)
        kinds = by_kind(self.spans)
        self.busy = cover(self.spans)  # the loader sorts spans by start
        self.comm = union(where(kinds, is_comm_kernel))
        self.compute = union(where(kinds, is_compute_kernel))
        self._comm_kinds = {key for key, group in kinds.items() if is_comm_kernel(group[0])}
        self._compute_kinds = {key for key, group in kinds.items() if is_compute_kernel(group[0])}
        # correlation id -> (direction, memory) of the device copy it started.
        copies = [s for s in self.spans if s.cat == "gpu_memcpy" and s.correlation is not None]
        self.copy_by_correlation: dict[int, CopyKind] = {s.correlation: copy_kind(s) for s in copies}
        # correlation id -> when the device began the copy: a host wait before it is for earlier queued work.
        self.copy_start: dict[int, float] = {s.correlation: s.ts for s in copies}
        self._placed: tuple[Sequence[Window], list[tuple[int, Span]]] | None = None

    def placed(self, windows: Sequence[Window]) -> list[tuple[int, Span]]:
        """(window index, span) for the spans that start inside one of the windows, found once per windows list."""
        if self._placed is None or self._placed[0] is not windows:
            window_of = _window_finder(windows)
            self._placed = (windows, [(i, s) for s in self.spans if (i := window_of(s.ts)) is not None])
        return self._placed[1]

    def window(self, t0: float, t1: float, kernel_us: float) -> WindowGpu:
        """Busy, kernel, collective and exposed-collective µs inside ``[t0, t1)``."""
        comm_in = clip(self.comm, t0, t1)
        exposed = total(subtract(comm_in, clip(self.compute, t0, t1)))
        return WindowGpu(total(clip(self.busy, t0, t1)), kernel_us, total(comm_in), exposed)

    def kernel_us_per_window(self, windows: Sequence[Window]) -> list[float]:
        """Kernel µs charged to the window each kernel *starts* in (kernels queued late run into the next)."""
        out = [0.0] * len(windows)
        for i, s in self.placed(windows):
            if s.cat in ("kernel", "mtia_ccp_events"):
                out[i] += s.end - s.ts
        return out

    def stats(
        self, windows: Sequence[Window], rows: Sequence[WindowGpu], launches: dict[int, tuple[float, float, object]], *,
        whole: bool = False, launched_by: Mapping[int, CollectiveKind] | None = None,
    ) -> GpuStats:
        """Totals over the windows, and the active-span shares (HTA's definitions).

        Like HTA, the active span leaves out the device work launched in the
        last step when there are several (it may run past the end of the
        trace): it holds the device events whose launching call (``launches``:
        correlation id -> host start) starts before the last step does. With
        one window (one step), or ``whole`` (a trace without steps, however it is cut), it is the whole trace.
        ``launched_by``: correlation id -> the collective of the host call that launched a collective kernel.
        """
        n = max(len(rows), 1)
        duration = sum(t1 - t0 for t0, t1 in windows)
        busy = sum(r.busy for r in rows)
        last = windows[-1][0]
        if len(windows) < 2 or whole:
            inside = self.spans  # one window or none: HTA takes the whole trace
        else:
            # Device work whose launch the trace did not record (begun before the profiler) is left out, as HTA does.
            inside = [s for s in self.spans if s.correlation in launches and launches[s.correlation][0] < last]
        active = cover(inside)
        extent = active[-1][1] - active[0][0] if active else 0.0
        compute = cover(s for s in inside if (s.name, s.cat) in self._compute_kinds)
        comm = cover(s for s in inside if (s.name, s.cat) in self._comm_kinds)
        by_kind, exposed_by_kind = self._by_collective(windows, n, launched_by or {})
        return GpuStats(
            utilization=busy / duration if duration else 0.0,
            busy_ms_per_step=busy / 1000 / n,
            idle_ms_per_step=(duration - busy) / 1000 / n,
            kernel_ms_per_step=sum(r.kernel for r in rows) / 1000 / n,
            comm_kernel_ms_per_step=sum(r.comm for r in rows) / 1000 / n,
            comm_exposed_ms_per_step=sum(r.exposed for r in rows) / 1000 / n,
            active_span_ms=extent / 1000,
            active_busy_share=total(active) / extent if extent else 0.0,
            active_compute_share=total(compute) / extent if extent else 0.0,
            comm_overlap=total(intersect(comm, compute)) / total(comm) if comm else None,
            comm_by_collective=by_kind,
            comm_exposed_by_collective=exposed_by_kind,
        )

    def _by_collective(
        self, windows: Sequence[Window], n: int, launched_by: Mapping[int, CollectiveKind]
    ) -> tuple[dict[CollectiveKind, float], dict[CollectiveKind, float]]:
        """Collective kernel ms per window by the collective each runs, and of it what no compute kernel overlaps;
        each largest first (GpuStats' ``comm_by_collective`` and ``comm_exposed_by_collective``)."""
        spans: dict[CollectiveKind, list[Window]] = defaultdict(list)
        for _, s in self.placed(windows):
            if (s.name, s.cat) in self._comm_kinds:
                host = launched_by.get(s.correlation, "other") if s.correlation is not None else "other"
                spans[collective_kind(s, host)].append((s.ts, s.end))
        ms = {kind: sum(e - t for t, e in ivs) / 1000 / n for kind, ivs in spans.items()}
        exposed = {kind: total(subtract(union(ivs), self.compute)) / 1000 / n for kind, ivs in spans.items()}
        # Equal exposure (none, when compute hides every collective) is ordered by kernel time.
        return dict(sorted(ms.items(), key=lambda kv: -kv[1])), dict(sorted(exposed.items(), key=lambda kv: (-kv[1], -ms[kv[0]])))

    def exposed_launched_in(
        self, windows: Sequence[Window], calls: Intervals, launches: Mapping[int, tuple[float, float, object]], thread: object
    ) -> float:
        """ms per window of the collective kernels whose launch ``thread`` made inside ``calls`` (sorted, disjoint)
        that no compute kernel overlaps."""
        inside = membership(calls)

        ivs = [
            (s.ts, s.end) for _, s in self.placed(windows)
            if (s.name, s.cat) in self._comm_kinds and s.correlation in launches
            and launches[s.correlation][2] == thread and inside(launches[s.correlation][0])
        ]
        return total(subtract(union(ivs), self.compute)) / 1000 / max(len(windows), 1)

    def kernel_ms_launched_in(
        self, windows: Sequence[Window], calls: Mapping[object, Intervals], launches: Mapping[int, tuple[float, float, object]]
    ) -> list[float]:
        """ms per window of the kernels whose launch a thread made inside that thread's ``calls`` (sorted, disjoint),
        each in the window of its launch: a device that runs behind the host runs them in a later one."""
        inside = {thread: membership(ivs) for thread, ivs in calls.items()}
        window_of = _window_finder(windows)
        out = [0.0] * len(windows)
        for s in self.spans:
            launch = launches.get(s.correlation) if s.cat == "kernel" and s.correlation is not None else None
            if launch is not None and launch[2] in inside and inside[launch[2]](launch[0]):
                if (i := window_of(launch[0])) is not None:
                    out[i] += (s.end - s.ts) / 1000
        return out

    def in_windows(self, windows: Sequence[Window]) -> list[Span]:
        """The device spans that start inside one of the windows."""
        return [s for _, s in self.placed(windows)]

    def top_kernels(self, windows: Sequence[Window], n: int) -> list[OpStat]:
        """The ``n`` kernels (by name) that take the most device time in the windows."""
        named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for s in self.in_windows(windows):
            if s.cat in ("kernel", "mtia_ccp_events"):
                named[s.name][0] += 1
                named[s.name][1] += s.end - s.ts
        return by_time(named)[:n]

    def groups(self, windows: Sequence[Window]) -> tuple[list[dict[str, float]], list[ProcessGroupComm]]:
        """Collective kernel ms per window by process group (the loader's ``group``, from the kernel's args), and each
        group's description, size, calls and elements per window. Kernels of one group run in order on one stream,
        so their durations add up; each holds the wait for the group's last member plus the transfer itself."""
        per_window: list[dict[str, float]] = [{} for _ in windows]
        seen: dict[str, tuple[str, int, list[int]]] = {}
        for i, s in self.placed(windows):
            if not s.args or (group := s.args.get("group")) is None:
                continue
            per_window[i][group] = per_window[i].get(group, 0.0) + (s.end - s.ts) / 1000
            _, _, counts = seen.setdefault(group, (s.args["group_desc"], s.args["group_size"], [0, 0]))
            counts[0] += 1
            counts[1] += s.args["elements"]
        n = max(len(windows), 1)
        info = [
            ProcessGroupComm(name=name, description=desc, size=size, calls_per_step=c / n, elements_per_step=e / n)
            for name, (desc, size, (c, e)) in sorted(seen.items())
        ]
        return per_window, info

    def copies(self, windows: Sequence[Window], host_calls: Sequence[Span], issuers: dict[int, str] | None = None) -> list[CopyStats]:
        """Copies per direction and memory kind: count and device time per window, host time blocked in their calls,
        and device time by who issued them (``issuers``: correlation id -> region / op)."""
        n = max(len(windows), 1)
        acc: dict[CopyKind, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        by: dict[CopyKind, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
        for s in self.in_windows(windows):
            if s.cat == "gpu_memcpy":
                of = copy_kind(s)
                row = acc[of]
                row[0] += 1
                row[1] += s.end - s.ts
                issuer = (issuers or {}).get(s.correlation) if s.correlation is not None else None
                if issuer is not None:
                    entry = by[of][issuer]
                    entry[0] += 1
                    entry[1] += s.end - s.ts
        for call in host_calls:
            kind = self.copy_by_correlation.get(call.correlation) if call.correlation is not None else None
            if kind is not None and kind in acc:
                acc[kind][2] += total(intersect([(call.ts, call.end)], union(windows)))
        return [
            CopyStats(
                direction=direction,
                host_memory=memory,
                calls_per_step=row[0] / n,
                device_ms_per_step=row[1] / 1000 / n,
                host_blocked_ms_per_step=row[2] / 1000 / n,
                issued_by=[
                    OpStat(name=name, calls=int(c), total_ms=us / 1000)
                    for name, (c, us) in sorted(by[(direction, memory)].items(), key=lambda kv: (-kv[1][1], kv[0]))
                ],
            )
            for (direction, memory), row in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        ]



def _window_finder(windows: Sequence[Window]) -> Callable[[float], int | None]:
    """A function from a time to the index of the window (sorted, disjoint) it falls in, if any."""
    starts = [w[0] for w in windows]

    def window_of(ts: float) -> int | None:
        i = bisect.bisect_right(starts, ts) - 1
        return i if i >= 0 and ts < windows[i][1] else None

    return window_of


def memory_peaks(trace: RankTrace) -> list[MemoryPeak]:
    """Each device's peak allocated memory in the trace, with the GPUs' capacity where the trace gives it."""
    capacity = {d.get("id"): d.get("totalGlobalMem") for d in trace.device_properties}
    peaks = []
    for (dev_type, dev_id), peak in sorted(trace.memory_peaks.items()):
        if dev_type == CPU_DEVICE_TYPE:
            peaks.append(MemoryPeak(device="cpu", peak_bytes=peak))
            continue
        # deviceProperties lists the CUDA (or HIP) devices, or an Intel GPU's (Kineto's XPU plugin: Level Zero's).
        listed = dev_type == CUDA_DEVICE_TYPE or (dev_type == XPU_DEVICE_TYPE and trace.device == "xpu")
        cap = capacity.get(dev_id) if listed else None
        peaks.append(
            MemoryPeak(device=device_label(dev_type, dev_id), peak_bytes=peak, capacity_bytes=cap if isinstance(cap, int) else None)
        )
    return peaks


def copy_issuer(ancestors: list[Span], around: frozenset[str]) -> str:
    """Who issued a copy: the innermost region (``record_function``, optimizer step; none ``around`` a step) and the outermost op around it."""
    region = next((a.name for a in reversed(ancestors) if is_region(a) and a.name not in around), None)
    op = next((a.name for a in ancestors if a.cat == "cpu_op" and parse_profiler_step(a.name) is None), None)
    return site(region, op) or "(no op)"

