"""Reading what a profile left on disk, for assertions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

# Any JSON value, for what a trace's metadata key may hold when another tool (or a damaged file) wrote it.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)

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


TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def case(name: str) -> Path:
    """A recorded fixture folder under tests/data/traces; fails loudly when it was not recorded."""
    import pytest

    path = TRACES / name
    if not path.is_dir():
        pytest.fail(f"fixture {path} is missing: run python tests/data/make_traces.py")
    return path


SHARED = Path(__file__).resolve().parents[3] / "shared"
EXTERNAL = SHARED / "external-traces"


def with_header(tmp_path: Path, name: str, **fields: object) -> Path:
    """A copy of the recorded ``name`` whose traces carry ``fields`` at their top level, as the agent writes them."""
    out = tmp_path / name
    sources = sorted(case(name).rglob("*.json.gz"))
    assert sources
    for src in sources:
        with gzip.open(src, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        copy = out / src.relative_to(case(name))
        copy.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(copy, "wt", encoding="utf-8") as f:
            json.dump({**fields, **doc}, f)
    return out


def shared(*parts: str) -> Path:
    """A folder of real traces under ../shared (beside the clone); fails loudly when it is missing."""
    import pytest

    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"shared traces {path} are missing: check out ../shared beside the repository")
    return path


def write_trace(path: Path, events: list[Any], *, rank: int | None = 0, world_size: int = 2, **top: Any) -> Path:
    """A small trace file (gzipped when ``path`` ends in .gz); ``rank=None`` writes no distributedInfo."""
    doc: dict[str, Any] = {"schemaVersion": 1, **top}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    doc["traceEvents"] = events
    text = json.dumps(doc)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def x_event(name: str, ts: float, dur: float, cat: str = "cpu_op", pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    """A complete ("X") event."""
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event
