"""Artifacts built from an exported trace in a child process."""

from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import sys

import pytest
import torch

from actors.export.contract import EXIT_MALFORMED, EXIT_TOO_LARGE
from actors.export.cut import plan_cut, write_kept
from actors.export.exporter import op_table, step_spans
from actors.export.reader import MalformedTrace, TraceReader
from tests.support.common import REPO


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A real CPU profile of a few training steps and its exported trace."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 26 * 26, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for _ in range(4):
            model(torch.randn(16, 1, 28, 28)).sum().backward()
            opt.step()
            prof.step()
    raw = tmp_path_factory.mktemp("export") / "trace.json"
    prof.export_chrome_trace(str(raw))
    return prof, raw


def test_op_table_counts_and_self_time_match_key_averages(profiled):
    prof, raw = profiled
    events = json.loads(raw.read_text())["traceEvents"]
    ours = {row[0]: row for row in op_table(events, by_shape=False)}
    theirs = {e.key: e for e in prof.key_averages()}

    for name in ["aten::conv2d", "aten::addmm", "aten::relu", "Optimizer.step#SGD.step"]:
        assert ours[name][2] == theirs[name].count
        assert ours[name][4] == pytest.approx(theirs[name].self_cpu_time_total, rel=0.02, abs=2.0)
        assert ours[name][3] == pytest.approx(theirs[name].cpu_time_total, rel=0.02, abs=2.0)


def test_op_table_groups_by_input_shape_when_asked(profiled):
    _, raw = profiled
    events = json.loads(raw.read_text())["traceEvents"]
    addmm = [row for row in op_table(events, by_shape=True) if row[0] == "aten::addmm"]
    assert addmm and all(row[1].startswith("[[") for row in addmm)


def test_op_table_of_ops_listed_out_of_start_order_is_the_same(profiled):
    # Other tracers, and timestamps rounded to the same µs, list a thread's ops out of order.
    _, raw = profiled
    events = json.loads(raw.read_text())["traceEvents"]

    shuffled = op_table(list(reversed(events)), by_shape=True)

    # Rows of equal self time may swap places (they are listed in first-seen order); each row is the same.
    assert sorted(shuffled) == sorted(op_table(events, by_shape=True))


def test_op_starting_with_its_parent_but_listed_first_is_nested_in_it():
    op = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 100.0, "args": {}}
    events = [{**op, "name": "child", "dur": 10.0}, {**op, "name": "parent", "dur": 30.0}]

    rows = {row[0]: row for row in op_table(events, by_shape=False)}

    assert (rows["parent"][3], rows["parent"][4]) == (30.0, 20.0)
    assert rows["child"][4] == 10.0


def test_child_process_writes_every_artifact_and_the_step_spans(profiled, tmp_path):
    _, raw = profiled
    out = subprocess.run(
        [sys.executable, "-m", "actors.export", str(raw), str(tmp_path), "--memory", "--shapes"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json.gz", "ops.csv", "trace.json.gz"]
    assert sorted(int(n) for n in result["steps"]) == sorted(step_spans(json.loads(raw.read_text())["traceEvents"]))
    assert gzip.decompress((tmp_path / "trace.json.gz").read_bytes()) == raw.read_bytes()
    timeline = json.loads(gzip.decompress((tmp_path / "memory.json.gz").read_bytes()))
    assert timeline["devices"]["cpu:-1"]["peak_allocated_bytes"] > 0
    header = next(csv.reader((tmp_path / "ops.csv").open()))
    assert header[:3] == ["name", "input_shapes", "count"]


def _export(raw, out, *args):
    return subprocess.run(
        [sys.executable, "-m", "actors.export", str(raw), str(out), *args], capture_output=True, text=True, check=False
    )


def test_trace_over_the_cap_is_cut_to_the_leading_steps_that_fit(profiled, tmp_path):
    _, fixture = profiled
    raw = tmp_path / "trace.json"
    raw.write_bytes(fixture.read_bytes())
    size = raw.stat().st_size
    all_steps = sorted(step_spans(json.loads(raw.read_text())["traceEvents"]))
    cap = int(size * 0.7)

    done = _export(raw, tmp_path, "--max-bytes", str(cap))
    result = json.loads(done.stdout)

    kept = sorted(int(n) for n in result["steps"])
    assert result["cut"] is True and result["raw_bytes"] == size
    assert 1 <= len(kept) < len(all_steps) and kept == all_steps[: len(kept)]
    stored = gzip.decompress((tmp_path / "trace.json.gz").read_bytes())
    assert len(stored) <= cap
    assert sorted(step_spans(json.loads(stored)["traceEvents"])) == kept


def test_trace_far_over_the_cap_is_refused_without_parsing(profiled, tmp_path):
    _, raw = profiled

    done = _export(raw, tmp_path, "--max-bytes", "100")

    assert done.returncode == EXIT_TOO_LARGE
    assert "the cap of 100 bytes" in done.stderr
    assert not (tmp_path / "trace.json.gz").exists()


def _step(n: int, ts: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts, "dur": 100}


def _gpu_trace(launch_cat: str = "cuda_runtime", launch_name: str = "cudaLaunchKernel") -> dict:
    """Two steps; step 7's kernel runs on into step 8's time, with its launch flow arrow."""
    launch = {"ph": "X", "cat": launch_cat, "name": launch_name, "pid": 1, "tid": 1, "ts": 90, "dur": 5}
    launch["args"] = {"correlation": 42}
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120, "dur": 50}
    kernel["args"] = {"correlation": 42}
    return {
        "schemaVersion": 1,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
            _step(7, 0),
            launch,
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 42, "pid": 1, "tid": 1, "ts": 90},
            kernel,
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 42, "pid": 0, "tid": 7, "ts": 120, "bp": "e"},
            _step(8, 100),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm" + "x" * 500, "pid": 1, "tid": 1, "ts": 110, "dur": 5},
        ],
    }


def _cut(tmp_path, trace: dict, cap: int) -> dict | None:
    """``trace`` written compactly, cut to ``cap`` by the two streaming passes; ``None`` when nothing fits."""
    raw = tmp_path / "trace.json"
    raw.write_text(json.dumps(trace, separators=(",", ":")))
    first = TraceReader(raw)
    cut = plan_cut(first.events(), first.header, cap)
    if cut is None:
        return None
    out = io.StringIO()
    kept = list(write_kept(out, TraceReader(raw, keep_text=True).events(), cut, first.header))
    assert len(out.getvalue().encode()) <= cap
    written = json.loads(out.getvalue())
    assert written["traceEvents"] == kept
    return written


@pytest.mark.parametrize(
    ("launch_cat", "launch_name"),
    [("cuda_runtime", "cudaLaunchKernel"), ("xpu_runtime", "urEnqueueKernelLaunch")],  # an NVIDIA/AMD GPU's, an Intel GPU's
)
def test_gpu_work_stays_with_the_step_that_launched_it(tmp_path, launch_cat, launch_name):
    trace = _gpu_trace(launch_cat, launch_name)
    full = len(json.dumps(trace, separators=(",", ":")))

    cut = _cut(tmp_path, trace, full - 300)

    names = [e["name"] for e in cut["traceEvents"]]
    assert names == ["process_name", "ProfilerStep#7", launch_name, "ac2g", "gemm", "ac2g"]
    assert cut["schemaVersion"] == 1


def test_no_cut_when_not_even_the_first_step_fits(tmp_path):
    assert _cut(tmp_path, _gpu_trace(), 200) is None


def test_cut_leaves_the_raw_trace_as_it_was_and_writes_only_the_artifacts(profiled, tmp_path):
    _, fixture = profiled
    raw = tmp_path / "raw" / "trace.json"
    raw.parent.mkdir()
    raw.write_bytes(fixture.read_bytes())
    out = tmp_path / "out"
    out.mkdir()

    done = _export(raw, out, "--memory", "--max-bytes", str(int(raw.stat().st_size * 0.7)))

    assert done.returncode == 0, done.stderr
    assert raw.read_bytes() == fixture.read_bytes()
    assert sorted(p.name for p in raw.parent.iterdir()) == ["trace.json"]
    assert sorted(p.name for p in out.iterdir()) == ["memory.json.gz", "ops.csv", "trace.json.gz"]


# ---- streaming: memory bounded by the largest event, not the trace --------------


@pytest.mark.parametrize("chunk_bytes", [1, 7, 4096])
def test_reader_yields_what_json_load_reads_whatever_the_chunk_size(profiled, chunk_bytes):
    _, raw = profiled
    whole = json.loads(raw.read_text())

    reader = TraceReader(raw, chunk_bytes=chunk_bytes)
    events = [ev for ev, _, _ in reader.events()]

    assert events == whole["traceEvents"]
    assert reader.header == {k: v for k, v in whole.items() if k != "traceEvents"}


def test_reader_sizes_are_the_utf8_bytes_of_each_event(tmp_path):
    raw = tmp_path / "t.json"
    events = ['{"name": "h\u00e9"}', '{"name": "\u00e9t\u00e9", "args": {"x": [1, 2]}}', "17"]
    raw.write_text('{"traceEvents": [' + ", ".join(events) + "], \"x\": 1}".replace("\\", ""), encoding="utf-8")

    sized = [(size, text) for _, size, text in TraceReader(raw, keep_text=True, chunk_bytes=3).events()]

    assert sized == [(len(e.encode()), e) for e in events]


@pytest.mark.parametrize(
    "text",
    ['{"traceEvents": [{"a": 1}', '{"traceEvents": [{"a": 1} {"b": 2}]}', '["not", "an", "object"]', '{"traceEvents": [1]} x'],
)
def test_malformed_trace_is_refused_with_a_reason(tmp_path, text):
    raw = tmp_path / "t.json"
    raw.write_text(text)

    with pytest.raises(MalformedTrace):
        list(TraceReader(raw).events())


def test_event_over_the_value_limit_is_refused_not_loaded(tmp_path):
    raw = tmp_path / "t.json"
    raw.write_text('{"traceEvents": [{"name": "' + "x" * 5000 + '"}]}')

    with pytest.raises(MalformedTrace, match="over 1000 bytes"):
        list(TraceReader(raw, chunk_bytes=100, max_value_bytes=1000).events())


def test_child_exits_with_its_own_status_on_a_malformed_trace(tmp_path):
    raw = tmp_path / "t.json"
    raw.write_text('{"traceEvents": [{"ph": "X",')

    done = _export(raw, tmp_path)

    assert done.returncode == EXIT_MALFORMED
    assert "cannot read the trace" in done.stderr


def _large_trace(path, profiled_raw, target_bytes: int) -> int:
    """The profiled trace's events repeated, shifted in time and renumbered, up to ``target_bytes``."""
    trace = json.loads(profiled_raw.read_text())
    events = trace.pop("traceEvents")
    # Shifted by the trace's length, not its end time: kineto's ts count µs from a base
    # time weeks back, and 500 copies of that would reach ~2^51, where a double's step is
    # 0.5 µs and merged timestamps put ops out of order (a different, costlier path).
    timed = [e for e in events if "ts" in e]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    with open(path, "w") as f:
        f.write(json.dumps(trace)[:-1] + ', "traceEvents": [\n')
        written, copy, first = 0, 0, True
        while written < target_bytes:
            for ev in events:
                if "ts" in ev:
                    ev = {**ev, "ts": ev["ts"] + copy * span}
                if str(ev.get("name", "")).startswith("ProfilerStep#"):
                    ev = {**ev, "name": f"ProfilerStep#{int(ev['name'].split('#')[1]) + 100 * copy}"}
                text = json.dumps(ev)
                f.write(text if first else ",\n" + text)
                written += len(text) + 2
                first = False
            copy += 1
        f.write("]}")
    return path.stat().st_size


# Linux keeps a process's peak RSS across exec, so a child forked from this
# (large) test process would report our size: a small launcher forks it instead.
_LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
"""


def _peak_rss_of_child(raw, out, *args) -> int:
    """Run the export child; returns its own peak RSS in bytes."""
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "actors.export", str(raw), str(out), *args],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    status, peak = (int(v) for v in done.stdout.split())
    assert status == 0, done.stderr[-2000:]
    return peak


@pytest.mark.parametrize("cut", [False, True])
def test_child_memory_is_a_fraction_of_the_trace_not_a_multiple(profiled, tmp_path, cut):
    # json.load held ~5.6x a trace's size; streaming holds a window and per-op numbers.
    _, fixture = profiled
    raw = tmp_path / "large.json"
    size = _large_trace(raw, fixture, 80 * 2**20)
    args = ["--memory", "--shapes", *(["--max-bytes", str(int(size * 0.6))] if cut else [])]

    peak = _peak_rss_of_child(raw, tmp_path, *args)

    assert peak < 0.5 * size, f"peak RSS {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB trace"


def test_the_childs_answer_is_the_contracts_result_and_uses_its_file_names(profiled, tmp_path):
    # Both sides build on actors/export/contract.py: the agent's command line, the child's
    # files, and the agent's typed reading of what the child prints.
    from pydantic import TypeAdapter

    from actors.export.contract import MEMORY_NAME, OPS_NAME, TRACE_NAME, ExportResult, child_args

    _, raw = profiled
    args = child_args(raw, tmp_path, memory=True, shapes=False, max_bytes=10**9)
    done = subprocess.run([sys.executable, "-m", "actors.export", *args], capture_output=True, text=True, check=True)
    result = TypeAdapter(ExportResult).validate_json(done.stdout)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MEMORY_NAME, OPS_NAME, TRACE_NAME])
    assert sorted(result.steps) == sorted(step_spans(json.loads(raw.read_text())["traceEvents"]))
    assert all(isinstance(n, int) for n in result.steps)
    assert result.cut is False and result.raw_bytes == raw.stat().st_size


def test_the_export_file_names_are_written_only_in_the_contract():
    names = ('"trace.json.gz"', '"ops.csv"', '"memory.json.gz"', '"trace.json"', '"--max-bytes"')
    homes = {
        str(path.relative_to(REPO)): [n for n in names if n in path.read_text()]
        for package in ("actors/export", "actors/agent")
        for path in (REPO / package).glob("*.py")
    }
    assert {path: found for path, found in homes.items() if found} == {
        "actors/export/contract.py": list(names)
    }
