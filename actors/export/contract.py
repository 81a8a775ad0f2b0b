"""What the export child and the agent that starts it agree on: its command line, the files
it writes, its exit codes and the result it prints.

Both sides import this module, so a name written here is written once. Standard library
only: the child must start fast (no pydantic, no torch); the agent validates the printed
result with pydantic at the boundary (``TypeAdapter(ExportResult)``, in
:mod:`actors.agent.capture`), which checks a standard dataclass as it would a model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "EXIT_MALFORMED",
    "EXIT_TOO_LARGE",
    "MEMORY_NAME",
    "OPS_NAME",
    "RAW_TRACE_NAME",
    "SNAPSHOT_NAME",
    "SNAPSHOT_PAGE_NAME",
    "TRACE_NAME",
    "ExportResult",
    "child_args",
]

# The raw trace as Kineto writes it, in the window's temp folder: the child's input.
RAW_TRACE_NAME = "trace.json"
# What the child writes next to it: the trace compressed (cut when over the cap), the
# per-operator table and, when memory was profiled, the memory timeline.
TRACE_NAME = "trace.json.gz"
OPS_NAME = "ops.csv"
MEMORY_NAME = "memory.json.gz"
# With memory_snapshot: the CUDA allocator's snapshot as the agent pickles it, and the page
# ``python -m actors.export.memory_view`` renders from it.
SNAPSHOT_NAME = "snapshot.pickle"
SNAPSHOT_PAGE_NAME = "snapshot.html"

# Nothing of the trace can be kept: its first step alone, or the whole trace at over
# twice the byte cap, is over the cap.
EXIT_TOO_LARGE = 3
# The trace is not a Chrome trace the reader can follow.
EXIT_MALFORMED = 4

# The child's flags, named once for the argument parser and the command line.
MEMORY_FLAG = "--memory"
SHAPES_FLAG = "--shapes"
MAX_BYTES_FLAG = "--max-bytes"


@dataclass(frozen=True)
class ExportResult:
    """What the child prints on stdout, as one JSON object, when it exits 0."""

    # ``ProfilerStep#N`` -> its duration in ms (JSON turns the keys into strings; validation turns them back).
    steps: dict[int, float]
    # The trace's ``baseTimeNanoseconds``; None where the trace has none.
    base_time_ns: int | None
    # Size of the raw trace in bytes, before any cut.
    raw_bytes: int
    # The trace was over the cap and cut to the leading whole steps that fit.
    cut: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def child_args(raw: Path, out: Path, *, memory: bool, shapes: bool, max_bytes: int | None) -> list[str]:
    """The child's arguments after ``python -m actors.export``."""
    args = [str(raw), str(out)]
    args += [MAX_BYTES_FLAG, str(max_bytes)] if max_bytes is not None else []
    args += [MEMORY_FLAG] if memory else []
    args += [SHAPES_FLAG] if shapes else []
    return args
