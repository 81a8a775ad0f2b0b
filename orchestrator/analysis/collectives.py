"""Which collectives a rank's main thread spends its communication time in, by name: the evidence the
communication finding chooses its fix from (DDP's all-reduce and FSDP's all-gather / reduce-scatter want
different changes)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.analysis.spans import is_comm
from orchestrator.models.analysis import OpStat
from orchestrator.traces.loader import Span

__all__ = ["comm_ops", "regathers_per_step"]

# FSDP2 names its regions after the module they serve: "FSDP::all_gather (layers.3)". One name per kind.
_MODULE_SUFFIX = re.compile(r" \([^()]*\)$")


def comm_ops(main: Sequence[Span], windows: Sequence[tuple[float, float]]) -> list[OpStat]:
    """The outermost collective spans of the main thread (sorted by start, parents first) that start inside
    one of ``windows``, summed by name with FSDP's module suffix removed; largest time first."""
    acc: dict[str, list[float]] = {}
    covered_until = float("-inf")
    for span in main:
        if not is_comm(span) or span.ts < covered_until:
            continue
        covered_until = span.end
        if not any(t0 <= span.ts < t1 for t0, t1 in windows):
            continue
        row = acc.setdefault(_MODULE_SUFFIX.sub("", span.name), [0, 0.0])
        row[0] += 1
        row[1] += span.end - span.ts
    return [
        OpStat(name=name, calls=int(c), total_ms=us / 1000)
        for name, (c, us) in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def regathers_per_step(main: Sequence[Span], windows: Sequence[tuple[float, float]]) -> float:
    """FSDP2: all-gathers per step of a unit already gathered in that step (``FSDP::all_gather (fqn)`` again: its
    parameters were resharded after forward and are gathered anew for backward), the mean over ``windows``."""
    seen: list[dict[str, int]] = [{} for _ in windows]
    for span in main:
        if span.name == "FSDP::all_gather" or span.name.startswith("FSDP::all_gather ("):
            for i, (t0, t1) in enumerate(windows):
                if t0 <= span.ts < t1:
                    seen[i][span.name] = seen[i].get(span.name, 0) + 1
    again = sum(c - 1 for counts in seen for c in counts.values() if c > 1)
    return again / max(len(windows), 1)
