"""Which collectives a rank's main thread spends its communication time in, by name: the evidence the
communication finding chooses its fix from (DDP's all-reduce and FSDP's all-gather / reduce-scatter want
different changes), and what NCCL's send/recv kernels run when the kernels do not say."""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.analysis.spans import Kinds, collective_of, is_comm
from orchestrator.models.analysis import CollectiveKind, OpStat

__all__ = ["comm_ops", "kernels_named_by_host", "regathers_per_step"]

# FSDP2 names its regions after the module they serve: "FSDP::all_gather (layers.3)". One name per kind.
_MODULE_SUFFIX = re.compile(r" \([^()]*\)$")
_GATHER = "FSDP::all_gather"
Window = tuple[float, float]


def comm_ops(main: Kinds, windows: Sequence[Window]) -> list[OpStat]:
    """The outermost collective spans of the main thread (its spans by kind) that start inside one of ``windows``,
    summed by name with FSDP's module suffix removed; largest time first."""
    spans = sorted((s for group in main.values() if is_comm(group[0]) for s in group), key=lambda s: (s.ts, -s.end))
    acc: dict[str, list[float]] = {}
    covered_until = float("-inf")
    for span in spans:
        if span.ts < covered_until:
            continue  # inside a collective already counted (c10d::_allgather_base_ in FSDP::all_gather)
        covered_until = span.end
        if _window_of(span.ts, windows) is not None:
            row = acc.setdefault(_MODULE_SUFFIX.sub("", span.name), [0, 0.0])
            row[0] += 1
            row[1] += span.end - span.ts
    return [
        OpStat(name=name, calls=int(c), total_ms=us / 1000)
        for name, (c, us) in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def kernels_named_by_host(by_kernel: dict[CollectiveKind, float], ops: Sequence[OpStat]) -> dict[CollectiveKind, float]:
    """Collective kernel ms by collective (``GpuStats.comm_by_collective``), NCCL's send/recv kernels told as the
    all-to-all they run where the host's collectives (``ops``) are all-to-alls and none is a send or a receive.

    NCCL runs an all-to-all as grouped sends and receives, and a trace before PyTorch 2.2 writes no collective name
    on its kernels: HTA's 128-rank TorchRec trace has 198 ms of ``ncclKernel_SendRecv`` a step, all launched by
    ``c10d::alltoall_base_`` (its embeddings' exchange), which read as a pipeline's sends."""
    host = {collective_of(op.name) for op in ops}
    if "send_recv" not in by_kernel or "all_to_all" not in host or "send_recv" in host:
        return by_kernel
    out = dict(by_kernel)
    out["all_to_all"] = out.get("all_to_all", 0.0) + out.pop("send_recv")
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def regathers_per_step(main: Kinds, windows: Sequence[Window]) -> float:
    """FSDP2: all-gathers per step of a unit already gathered in that step (``FSDP::all_gather (fqn)`` again: its
    parameters were resharded after forward and are gathered anew for backward), the mean over ``windows``."""
    again = 0
    for (name, _), group in main.items():
        if name == _GATHER or name.startswith(_GATHER + " ("):
            per_window: dict[int, int] = {}
            for span in group:
                if (i := _window_of(span.ts, windows)) is not None:
                    per_window[i] = per_window.get(i, 0) + 1
            again += sum(c - 1 for c in per_window.values())
    return again / max(len(windows), 1)


def _window_of(ts: float, windows: Sequence[Window]) -> int | None:
    return next((i for i, (t0, t1) in enumerate(windows) if t0 <= ts < t1), None)
