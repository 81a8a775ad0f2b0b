"""Artifacts built from an exported trace in a child process."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys

import pytest
import torch

from actors.export import op_table, step_spans


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
