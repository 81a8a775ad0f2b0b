"""Analysis of a profile's traces: per-rank and cross-rank results, findings, the report, the diff.

The front (a folder of rank traces in, a :class:`~orchestrator.models.analysis.Summary` out) is
:mod:`orchestrator.analysis.front`. Its functions are re-exported here, loaded on first use, so
that importing one module of the package (the report, the diff) does not load the analysis.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Finding", "RankSummary", "Summary", "analyze_and_scan", "analyze_file", "analyze_folder", "analyze_for_merge",
    "analyze_traces",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from orchestrator.analysis import front

        return getattr(front, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
