"""The device check (benchmarks/gpu.py) runs its whole flow on CPU, so the script a GPU machine
gets has run before it travels there; its CUDA-only checks are left out on CPU, by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.gpu_lasting import CPU_SETTINGS
from orchestrator.analysis import analyze_folder
from tests.support.common import REPO


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    """One quick run of the whole check on CPU, its profiles kept: its exit, its results and the kept folder."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    out, keep = tmp / "gpu.json", tmp / "kept"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--quick", "--keep", str(keep), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    return done, json.loads(out.read_text()), keep


def test_the_device_check_runs_end_to_end_on_cpu_and_finds_the_dataloader_bound_loop(cpu_run):
    done, result, _ = cpu_run
    assert done.returncode == 0, (result["failures"], result["errors"], done.stderr[-2000:])
    for name in ("cnn", "transformer"):
        assert result["windows"][name]["windows"] == 2 and result["windows"][name]["bad_windows"] == []
    assert "memory_timeline" in result["profile_memory"]["artifacts"]
    assert result["verdicts"]["dataloader_bound"]["first_finding"] == "dataloader_bound"
    assert "dataloader_bound" not in result["verdicts"]["healthy_cnn"]["warnings"]
    python = result["verdicts"]["python_bound"]
    assert python["first_finding"] == "host_python" and "_score_labels" in python["first_fix"]
    assert result["export_child"]["peak_rss_mib"] > 0
    # The loop left under anomaly detection is told so, through the agent's own capture; no other loop is.
    assert "anomaly_mode" in result["verdicts"]["anomaly"]["findings"]
    assert not any("anomaly_mode" in v["findings"] for name, v in result["verdicts"].items() if name != "anomaly")
    # The transformer keeping a weights' average one tensor at a time (AveragedModel given an avg_fn) is told so.
    assert "param_loop" in result["verdicts"]["ema"]["findings"]
    assert not any("param_loop" in v["findings"] for name, v in result["verdicts"].items() if name != "ema")
    # The loop that generates with transformers' generate inside its step is told so first; no other loop is.
    assert result["verdicts"]["generation"]["first_finding"] == "generation" and result["skipped"] == []
    assert not any("generation" in v["findings"] for name, v in result["verdicts"].items() if name != "generation")
    # The compiled model's first window holds its compilation, the later one none (what the trace records, not
    # step times: beside other work on two cores a steady step took 1.5 s, twice the compiling one).
    first, steady = result["warm_up"]["first_steps"], result["warm_up"]["steady"]
    assert (first["state"], steady["state"]) == ("DONE", "DONE")
    assert first["compile_spans"] > 0 and steady["compile_spans"] == 0
    # CUDA-only checks are absent on CPU, not passed vacuously.
    assert ("oom" in result, "memory_snapshot" in result) == (torch.cuda.is_available(),) * 2


def test_kept_profiles_are_read_again_as_the_check_read_them(cpu_run):
    _, result, keep = cpu_run
    again = analyze_folder(keep / "store" / "gpu" / "dl-bound")
    assert again.findings[0].code == result["verdicts"]["dataloader_bound"]["first_finding"] == "dataloader_bound"


def test_keep_refuses_a_folder_that_holds_files_already(tmp_path):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("not the check's")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--keep", str(tmp_path / "kept"), "--out", str(tmp_path / "x.json")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2 and "the folder is not empty" in done.stderr
    assert (tmp_path / "kept" / "mine.txt").read_text() == "not the check's"


def test_the_lasting_probe_runs_each_setting_in_its_own_process_on_cpu(tmp_path):
    out = tmp_path / "lasting.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_lasting", "--device", "cpu", "--rounds", "1", "--windows", "2",
         "--steps", "3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0, [r.get("error") for r in result["runs"]]
    assert sorted(r["setting"] for r in result["runs"]) == sorted(CPU_SETTINGS)
    assert set(result["summary"]) == set(CPU_SETTINGS)
    assert all(r["after"] > 0 and r["a_a"] > 0 for r in result["runs"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run, not refuse")
def test_the_device_check_refuses_cuda_on_a_machine_without_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--out", str(tmp_path / "x.json")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2 and "no CUDA device here" in done.stderr
