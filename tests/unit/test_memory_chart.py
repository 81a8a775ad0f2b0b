"""The report draws each rank's memory timeline (a real CPU profile's, through the export child)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.analysis.memory_chart import MemorySeries, downsample, load_timelines, render_memory_section
from orchestrator.analysis.report import render_report
from orchestrator.models.analysis import Summary


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> Path:
    """``memory.json.gz`` of four real training steps recorded with profile_memory."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        profile_memory=True,
    ) as prof:
        for _ in range(4):
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            prof.step()
    folder = tmp_path_factory.mktemp("memory")
    raw = folder / "trace.json"
    prof.export_chrome_trace(str(raw))
    subprocess.run([sys.executable, "-m", "actors.export", str(raw), str(folder), "--memory"], check=True, capture_output=True)
    return folder / "memory.json.gz"


def _profile_folder(tmp_path: Path, timeline: Path, ranks: list[int]) -> Path:
    for rank in ranks:
        (tmp_path / "memory").mkdir(exist_ok=True)
        shutil.copy(timeline, tmp_path / "memory" / f"rank{rank}.memory_timeline.json.gz")
    return tmp_path


def test_each_rank_and_device_gets_a_labelled_chart_with_its_peak(tmp_path, timeline):
    peak = json.loads(gzip.decompress(timeline.read_bytes()))["devices"]["cpu:-1"]["peak_allocated_bytes"]

    html = render_memory_section(*load_timelines(_profile_folder(tmp_path, timeline, [0, 1])))

    labels = re.findall(r'aria-label="([^"]+)"', html)
    assert [label.split(":")[0] for label in labels] == ["memory of rank 0 on cpu", "memory of rank 1 on cpu"]
    assert f"peak {peak / 2**20:.1f} MiB allocated" in labels[0]
    assert html.count("<polyline") >= 2


def test_the_report_holds_the_memory_section_and_no_script(tmp_path, timeline):
    memory = render_memory_section(*load_timelines(_profile_folder(tmp_path, timeline, [0])))

    html = render_report(Summary(source="s", world_size=1, steps=[], ranks=[]), memory=memory)

    assert '<section id="memory"><h2>Memory timeline</h2>' in html
    assert "<script" not in html


def test_a_profile_without_memory_has_no_memory_section(tmp_path):
    assert render_memory_section(*load_timelines(tmp_path)) == ""


def test_an_unreadable_timeline_is_named_and_the_others_are_drawn(tmp_path, timeline):
    folder = _profile_folder(tmp_path, timeline, [0])
    (folder / "memory" / "rank1.memory_timeline.json.gz").write_bytes(gzip.compress(b'{"devices": [1, 2]}'))

    timelines, notes = load_timelines(folder)
    html = render_memory_section(timelines, notes)

    assert sorted(timelines) == [0]
    assert notes == ["rank1.memory_timeline.json.gz: not a memory timeline: no 'devices' object"]
    assert "rank1.memory_timeline.json.gz: not a memory timeline" in html


def test_a_device_name_cannot_inject_markup(tmp_path):
    series = MemorySeries(ts_us=[0.0, 10.0], allocated_bytes=[0.0, 2.0**20])

    html = render_memory_section({0: {'<img src=x onerror="a()">': series}})

    assert "<img" not in html and "&lt;img" in html


def test_downsampling_keeps_every_windows_peak():
    alloc = [float(i % 100) for i in range(10_000)]
    alloc[5_555] = 1e9
    series = MemorySeries(ts_us=[float(i) for i in range(10_000)], allocated_bytes=alloc)

    cut = downsample(series, points=100)

    assert len(cut.ts_us) == 100
    assert max(cut.allocated_bytes) == 1e9
    assert cut.peak_allocated_bytes == 1e9
