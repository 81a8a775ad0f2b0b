"""Reading what a profile left on disk, for assertions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def load_trace(path: Path) -> dict[str, Any]:
    """A Chrome trace, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def profiler_steps(trace: dict[str, Any]) -> list[int]:
    """Sorted global step numbers of the ``ProfilerStep#N`` spans in a trace."""
    return sorted(
        int(e["name"].split("#", 1)[1])
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
    )


def has_input_shapes(trace: dict[str, Any]) -> bool:
    """Whether any op in the trace recorded its input shapes."""
    return any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"] if e.get("cat") == "cpu_op")


TRACES = Path(__file__).parent / "data" / "traces"


def case(name: str) -> Path:
    """A recorded fixture folder under tests/data/traces; fails loudly when it was not recorded."""
    import pytest

    path = TRACES / name
    if not path.is_dir():
        pytest.fail(f"fixture {path} is missing: run python tests/data/make_traces.py")
    return path
