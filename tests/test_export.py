"""Artifacts built from an exported trace in a child process."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys

import pytest
import torch

from actors.export import EXIT_TOO_LARGE, op_table, step_spans, trim_to_cap


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


def _gpu_trace() -> dict:
    """Two steps; step 7's kernel runs on into step 8's time, with its launch flow arrow."""
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 90, "dur": 5}
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


def test_gpu_work_stays_with_the_step_that_launched_it():
    trace = _gpu_trace()
    full = len(json.dumps(trace, separators=(",", ":")))

    cut = trim_to_cap(trace, full - 300)

    names = [e["name"] for e in cut["traceEvents"]]
    assert names == ["process_name", "ProfilerStep#7", "cudaLaunchKernel", "ac2g", "gemm", "ac2g"]


def test_no_cut_when_not_even_the_first_step_fits():
    assert trim_to_cap(_gpu_trace(), 200) is None
