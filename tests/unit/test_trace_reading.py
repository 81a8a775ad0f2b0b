"""Reading traces: the 19 real Kineto traces in ../shared/external-traces, the stream reader's edge cases."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from orchestrator.traces.discover import TraceSet, discover_traces
from orchestrator.traces.loader import RankTrace, load_rank
from orchestrator.traces.stream import TraceParseError, TraceReader, iter_trace, read_header
from tests.support.tracefiles import EXTERNAL, shared, write_trace, x_event

# folder -> (ranks, device, has ProfilerStep#N): what each real trace is, from its README and source.
EXPECTED: dict[str, tuple[list[int], str, bool]] = {
    "hta_alexnet_no_profilerstep": ([0], "cuda", False),
    "hta_amd_mi250_minitoy": ([0], "rocm", True),
    "hta_cpu_only_r34of300": ([34], "cpu", True),
    "hta_df_index_resolver_v100_r1of2": ([1], "cuda", True),
    "hta_mtia_single_rank": ([0], "mtia", True),
    "hta_nccl_parser_a100_r0of2": ([0], "cuda", True),
    "hta_negative_queue_a100_r0of16": ([0], "cuda", True),
    "hta_ns_resolution_v100_1rank": ([0], "cuda", True),
    "hta_trace_diff_control_a100_r3of8": ([3], "cuda", True),
    "hta_trace_diff_test_v100_r1of2": ([1], "cuda", True),
    "hta_trace_filter_2of128": ([0, 1], "cuda", True),
    "param_dlrm_v100_8ranks": (list(range(8)), "cuda", True),
    "param_resnet_no_profilerstep": ([0], "cuda", False),
    "tbplugin_resnet50_nw0_a": ([0], "cuda", True),
    "tbplugin_resnet50_nw0_as_shipped": ([0, 1], "cuda", True),
    "tbplugin_resnet50_nw0_b": ([0], "cuda", True),
    "tbplugin_resnet50_nw4_a": ([0], "cuda", True),
    "tbplugin_resnet50_nw4_b": ([0], "cuda", True),
    "tracelens_mi300_resnet_ckpt_r0of8": ([0], "rocm", True),
}
LEGACY = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}


@cache
def discovered(name: str) -> TraceSet:
    return discover_traces(shared("external-traces", name))


@cache
def loaded(name: str) -> tuple[RankTrace, ...]:
    return tuple(load_rank(tf) for tf in discovered(name).files)


def test_every_external_trace_folder_is_expected() -> None:
    assert sorted(p.name for p in shared("external-traces").iterdir() if p.is_dir() and p.name != "LICENSES") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_external_trace_loads_with_its_rank_device_and_schedule(name: str) -> None:
    ranks, device, has_steps = EXPECTED[name]
    found = discovered(name)
    assert found.rejected == []
    assert [tf.rank for tf in found.files] == ranks
    for trace in loaded(name):
        assert trace.device == device
        assert trace.has_profiler_steps is has_steps
        assert trace.spans and trace.events >= len(trace.spans)


def test_lone_file_without_a_rank_is_rank_zero_without_a_note() -> None:
    found = discovered("param_resnet_no_profilerstep")
    (tf,) = found.files
    assert (tf.rank, tf.rank_source) == (0, "lone file")
    assert found.issues == []


def test_files_without_a_rank_take_ranks_in_file_name_order_with_a_note() -> None:
    found = discovered("tbplugin_resnet50_nw0_as_shipped")
    assert [(tf.rank, tf.path.name, tf.rank_source) for tf in found.files] == [
        (0, "worker0.1623143089861.pt.trace.json.gz", "file order"),
        (1, "worker0.1623143566756.pt.trace.json.gz", "file order"),
    ]
    assert found.issues == [
        "worker0.1623143089861.pt.trace.json.gz names no rank: taken as rank 0 by file name order",
        "worker0.1623143566756.pt.trace.json.gz names no rank: taken as rank 1 by file name order",
    ]


def test_file_without_a_rank_beside_ranked_files_takes_the_lowest_free_rank(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.pt.trace.json", [], rank=0)
    write_trace(tmp_path / "trainer.pt.trace.json", [], rank=None)
    found = discover_traces(tmp_path)
    assert [(tf.rank, tf.path.name) for tf in found.files] == [(0, "rank0.pt.trace.json"), (1, "trainer.pt.trace.json")]
    assert found.issues == ["trainer.pt.trace.json names no rank: taken as rank 1 by file name order"]


def test_rank_from_distributed_info_wins_over_file_order() -> None:
    assert [tf.rank_source for tf in discovered("param_dlrm_v100_8ranks").files] == ["distributedInfo"] * 8


def test_pytorch_1_8_category_names_are_read_as_todays() -> None:
    (trace,) = loaded("tbplugin_resnet50_nw0_a")
    assert trace.category_aliases == LEGACY
    assert {s.cat for s in trace.spans} == {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}
    assert sum(s.name.startswith("ProfilerStep#") for s in trace.spans) == 6
    assert any(s.name.startswith("enumerate(DataLoader)#") for s in trace.spans)


def test_todays_trace_has_no_category_aliases() -> None:
    assert all(t.category_aliases == {} for t in loaded("param_dlrm_v100_8ranks"))


def test_rocm_is_told_apart_from_cuda_without_a_roctracer_header() -> None:
    (mi250,) = loaded("hta_amd_mi250_minitoy")
    assert "roctracer_version" not in mi250.header and mi250.device == "rocm"
    (mi300,) = loaded("tracelens_mi300_resnet_ckpt_r0of8")
    assert "roctracer_version" in mi300.header and mi300.device == "rocm"


def test_rocm_runtime_fields_written_as_strings_do_not_reject_the_trace() -> None:
    (mi300,) = loaded("tracelens_mi300_resnet_ckpt_r0of8")
    sizes = [s.args["bytes"] for s in mi300.spans if s.cat == "gpu_memcpy" and s.args]
    assert len(sizes) == 366 and all(isinstance(n, int) for n in sizes)
    assert all(s.stream is None for s in mi300.spans if s.cat == "cuda_runtime")


def test_mtia_trace_keeps_its_runtime_and_device_spans() -> None:
    (trace,) = loaded("hta_mtia_single_rank")
    cats = {s.cat for s in trace.spans}
    assert {"mtia_runtime", "mtia_ccp_events"} <= cats


def test_cpu_only_trace_has_no_device_spans() -> None:
    (trace,) = loaded("hta_cpu_only_r34of300")
    assert trace.device == "cpu"
    assert {s.cat for s in trace.spans} <= {"cpu_op", "user_annotation"}


def test_missing_ranks_of_a_large_world_are_listed_as_ranges() -> None:
    assert discovered("hta_cpu_only_r34of300").issues == ["no usable trace for rank(s) [0-33, 35-299] of world_size 300"]


def test_device_spans_carry_stream_device_and_external_id() -> None:
    trace = loaded("param_dlrm_v100_8ranks")[0]
    kernels = [s for s in trace.spans if s.cat == "kernel"]
    assert kernels and all(isinstance(s.stream, int) and isinstance(s.device, int) for s in kernels)
    assert all(isinstance(s.correlation, int) and isinstance(s.external_id, int) for s in kernels)


def test_spans_are_sorted_by_start_then_longest_first() -> None:
    spans = loaded("param_dlrm_v100_8ranks")[0].spans
    assert all((a.ts, -a.end) <= (b.ts, -b.end) for a, b in zip(spans, spans[1:]))


def test_loaded_trace_counts_events_and_raw_bytes() -> None:
    path = EXTERNAL / "hta_amd_mi250_minitoy" / "traces" / "mi250_minitoy_train_ROCm6_2_kineto.pt.trace.json.gz"
    with gzip.open(path, "rb") as f:
        raw = f.read()
    (trace,) = loaded("hta_amd_mi250_minitoy")
    assert trace.raw_bytes == len(raw)
    assert trace.events == len(json.loads(raw)["traceEvents"])


@pytest.mark.parametrize("folder", ["seed003_before", "seed003_after"])
def test_h100_recordings_load_as_cuda_with_steps(folder: str) -> None:
    (tf,) = discover_traces(shared("gpu-traces", folder)).files
    trace = load_rank(tf)
    assert (trace.device, trace.has_profiler_steps) == ("cuda", True)


# ---- the stream reader ------------------------------------------------------


def events_of(path: Path) -> list[dict[str, Any]]:
    return [value for kind, _, value in iter_trace(path) if kind == "event"]


def test_plain_and_gzipped_traces_read_the_same(tmp_path: Path) -> None:
    events = [x_event(f"op{i}", i, 1.0) for i in range(1000)]
    plain = write_trace(tmp_path / "a.pt.trace.json", events)
    packed = write_trace(tmp_path / "b.pt.trace.json.gz", events)
    assert events_of(plain) == events_of(packed) == events


def test_pretty_printed_trace_reads_like_compact(tmp_path: Path) -> None:
    events = [x_event(f"op{i}", i, 1.0, External_id=i) for i in range(300)]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=4))
    assert events_of(path) == events


def test_separators_inside_strings_and_nested_objects_do_not_cut_events(tmp_path: Path) -> None:
    tricky = ['"}, {"', "}, ]", "},{", "\\\"}, {", "ü}, {é"]
    events = [x_event(text * (i % 7 + 1), i, 1.0, nested=[{"a": text}, {"b": [{"c": "}"}]}]) for i, text in enumerate(tricky * 40)]
    path = write_trace(tmp_path / "t.pt.trace.json", events)
    assert events_of(path) == events


def test_bare_array_is_read_as_events(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps([x_event("a", 1, 2), x_event("b", 3, 4)]))
    assert [e["name"] for e in events_of(path)] == ["a", "b"]


def test_trailing_comma_after_the_last_event_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1},\n], "schemaVersion": 1}')
    assert [e["name"] for e in events_of(path)] == ["a"]
    assert read_header(path) == {"schemaVersion": 1}


def test_header_read_stops_before_the_events(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.pt.trace.json", [x_event("a", 1, 1)], rank=3, baseTimeNanoseconds=5)
    reader = TraceReader(path, events=False)
    assert dict((k, v) for _, k, v in reader) == {"schemaVersion": 1, "baseTimeNanoseconds": 5,
                                                  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 2}}
    assert reader.events == 0


def test_paired_types_decode_each_batch_twice(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.pt.trace.json", [x_event(f"op{i}", i, 1) for i in range(50)])
    batches = [value for kind, _, value in TraceReader(path, (Any, msgspec.Raw)) if kind == "events"]
    assert all(len(dicts) == len(raws) for dicts, raws in batches)
    assert [json.loads(bytes(r)) for _, raws in batches for r in raws] == [d for dicts, _ in batches for d in dicts]


def test_value_over_the_limit_is_refused_with_the_limit_in_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "' + "x" * (3 << 20) + '", "ts": 1}]}')
    with pytest.raises(TraceParseError, match="over the 1 MiB limit"):
        list(TraceReader(path, limit=1 << 20))


@pytest.mark.parametrize(
    "text, reason",
    [
        ('{"traceEvents": [{"ph": "X"}', "ends at byte 28 .*truncated"),
        ('{"traceEvents": {}}', "not an array"),
        ('{"traceEvents": [{"ph": "X", "ts": NaN}]}', "malformed"),
        ('{"schemaVersion": 1,', "ends at byte 20"),
        ('{"schemaVersion": 1 2}', "expected ',' at byte 20"),
        ("", "ends at byte 0"),
    ],
)
def test_damaged_trace_raises_parse_error_with_a_reason(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_text(text)
    with pytest.raises(TraceParseError, match=reason):
        list(iter_trace(path))


def test_truncated_gzip_raises_parse_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.pt.trace.json.gz", [x_event(f"op{i}", i, 1) for i in range(5000)])
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(TraceParseError):
        list(iter_trace(path))
