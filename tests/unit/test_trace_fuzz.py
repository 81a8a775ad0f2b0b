"""Hostile and malformed traces: one bad rank is rejected with its reason, nothing else escapes.

The named cases are issue 10 item 9's; the Hypothesis properties throw
arbitrary JSON, damaged bytes and odd event fields at the reader, the loader
and the merge.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.traces.discover import discover_traces
from orchestrator.traces.loader import load_rank
from orchestrator.traces.merge import merge_folder
from orchestrator.traces.stream import TraceParseError, iter_trace
from tests.support.tracefiles import write_trace, x_event

FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))

GOOD = [x_event("ProfilerStep#1", 0, 100, cat="user_annotation"), x_event("aten::mm", 10, 50)]
_OP = '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20, "dur": 5'
HOSTILE = {
    "args is a list": _OP + ', "args": [1, 2]}',
    "name is a list": '{"ph": "X", "cat": "cpu_op", "name": ["aten::add"], "ts": 20, "dur": 5}',
    "string Device Type": '{"ph": "i", "name": "[memory]", "ts": 20, "args": {"Device Type": "cuda", "Total Allocated": 5}}',
    "5,000-digit integer": '{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1' + "0" * 5000 + ', "dur": 5}',
    "arrays nested 200,000 deep": _OP + ', "args": {"x": ' + "[" * 200_000 + "]" * 200_000 + "}}",
    "NaN": _OP.replace('"dur": 5', '"dur": NaN') + "}",
    "Infinity": _OP.replace('"ts": 20', '"ts": Infinity') + "}",
    "a number beyond a double": _OP.replace('"ts": 20', '"ts": 1e400') + "}",
    "a time no clock wrote": _OP.replace('"ts": 20', '"ts": 1e300') + "}",
}


def hostile_folder(folder: Path, event: str) -> Path:
    write_trace(folder / "rank0.pt.trace.json", GOOD, rank=0)
    good = ", ".join(json.dumps(e) for e in GOOD)
    (folder / "rank1.pt.trace.json").write_text(
        '{"distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": [' + good + ", " + event + "]}"
    )
    return folder


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_rank_is_refused_by_the_loader_with_a_reason(tmp_path: Path, case: str) -> None:
    found = discover_traces(hostile_folder(tmp_path, HOSTILE[case]))
    with pytest.raises(TraceParseError) as refused:
        load_rank(found.files[1])
    assert str(refused.value)
    load_rank(found.files[0])


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_rank_is_rejected_and_the_other_rank_analysed(tmp_path: Path, case: str) -> None:
    summary = analyze_folder(hostile_folder(tmp_path, HOSTILE[case]))
    assert [r.rank for r in summary.ranks] == [0]
    (rejected,) = summary.rejected
    assert rejected.rank == 1 and rejected.reason.startswith("unreadable trace: ")


# Valid JSON of the wrong shape for the analysis is still a viewable event: the merge carries it.
CARRIED = {"args is a list", "string Device Type"}


def merged_names(folder: Path) -> list[str]:
    with gzip.open(folder / "m.json.gz", "rt") as f:
        return [e.get("name") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.parametrize("case", sorted(set(HOSTILE) - CARRIED))
def test_merge_cuts_a_rank_short_where_it_stops_being_json_it_can_carry(tmp_path: Path, case: str) -> None:
    stats = merge_folder(hostile_folder(tmp_path, HOSTILE[case]), tmp_path / "m.json.gz")
    assert stats.ranks == [0, 1]
    (damaged,) = stats.truncated
    assert damaged.rank == 1 and damaged.reason.startswith("damaged after 2 events: ")
    assert merged_names(tmp_path).count("aten::mm") == 2


@pytest.mark.parametrize("case", sorted(CARRIED))
def test_merge_carries_valid_json_the_analysis_refuses(tmp_path: Path, case: str) -> None:
    stats = merge_folder(hostile_folder(tmp_path, HOSTILE[case]), tmp_path / "m.json.gz")
    assert stats.truncated == [] and stats.events == 5


def test_long_integer_in_a_field_nobody_reads_does_not_reject_the_rank(tmp_path: Path) -> None:
    event = _OP + ', "args": {"Sequence number": 1' + "0" * 5000 + "}}"
    found = discover_traces(hostile_folder(tmp_path, event))
    assert [s.name for s in load_rank(found.files[1]).spans] == ["ProfilerStep#1", "aten::mm", "aten::add"]


# ---- properties -------------------------------------------------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(['"}, {"', "},", "]", "\\", "{"])
_SCALAR = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_JSON = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=12)
_EVENT = st.dictionaries(st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"]) | _TEXT, _JSON, max_size=8)
_KINETO_EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "i", "M", "s", "f"]),
        "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "Operator", "Kernel", "cuda_runtime", "ac2g", "mtia_runtime"]),
        "name": st.sampled_from(["ProfilerStep#3", "aten::mm", "ncclKernel_AllReduce", "cudaMemcpyAsync", "[memory]", "thread_name"]) | _TEXT,
        "pid": st.integers(0, 5) | _TEXT,
        "tid": st.integers(0, 5),
        "ts": st.floats(0, 1e9),
        "dur": st.floats(0, 1e6),
    },
    optional={"args": st.dictionaries(st.sampled_from(["correlation", "External id", "bytes", "stream", "Device Type", "Total Allocated", "Process Group Name", "Process Group Ranks", "Group size", "In msg nelems"]) | _TEXT, _JSON, max_size=4)},
)


def _write(folder: Path, name: str, doc: Any, indent: int | None, packed: bool) -> Path:
    text = json.dumps(doc, indent=indent)
    path = folder / (name + (".gz" if packed else ""))
    path.write_bytes(gzip.compress(text.encode()) if packed else text.encode())
    return path


@FUZZ
@given(events=st.lists(_JSON, max_size=30), indent=st.sampled_from([None, 0, 2]), packed=st.booleans())
def test_reader_yields_exactly_what_the_stdlib_parses(events: list[Any], indent: int | None, packed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "t.pt.trace.json", {"schemaVersion": 1, "traceEvents": events, "tail": events[:2]}, indent, packed)
        items = list(iter_trace(path))
    assert [v for kind, _, v in items if kind == "event"] == [e for e in events if isinstance(e, dict)]
    assert [(k, v) for kind, k, v in items if kind == "key"] == [("schemaVersion", 1), ("tail", events[:2])]


@FUZZ
@given(events=st.lists(_KINETO_EVENT, min_size=1, max_size=40), cut=st.integers(0, 10**6), junk=st.binary(max_size=8), packed=st.booleans())
def test_damaged_bytes_only_ever_raise_a_parse_error(events: list[dict[str, Any]], cut: int, junk: bytes, packed: bool) -> None:
    text = json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}).encode()
    cut %= len(text)
    data = text[:cut] + junk + text[cut + len(junk) // 2 :]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.pt.trace.json"
        path.write_bytes(gzip.compress(data)[: max(10, cut % 200 + 10)] if packed and junk else data)
        try:
            list(iter_trace(path))
        except TraceParseError:
            pass
        found = discover_traces(Path(tmp))
        for tf in found.files:
            try:
                load_rank(tf)
            except TraceParseError:
                pass
        stats = merge_folder(Path(tmp), Path(tmp) / "m.json.gz")
        assert len(stats.ranks) + len(stats.skipped) + len(found.rejected) >= 1
        with gzip.open(Path(tmp) / "m.json.gz", "rt") as f:
            json.load(f)


@FUZZ
@given(ranks=st.lists(st.lists(_KINETO_EVENT | _EVENT, max_size=30), min_size=1, max_size=3), budget=st.integers(1, 200_000))
def test_loader_and_merge_take_any_events_without_raising(ranks: list[list[dict[str, Any]]], budget: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rank, events in enumerate(ranks):
            write_trace(folder / f"rank{rank}.pt.trace.json", events, rank=rank, world_size=len(ranks))
        for tf in discover_traces(folder).files:
            try:
                trace = load_rank(tf)
            except TraceParseError:
                continue
            assert trace.device in ("cuda", "rocm", "mtia", "cpu")
        stats = merge_folder(folder, folder / "m.json.gz", max_bytes=budget)
        with gzip.open(folder / "m.json.gz", "rt") as f:
            doc = json.load(f)
    assert stats.ranks == list(range(len(ranks)))
    metadata = sum(1 for e in doc["traceEvents"] if e.get("name") in ("process_name", "process_sort_index"))
    assert stats.events == len(doc["traceEvents"]) - metadata
