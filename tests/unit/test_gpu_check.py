"""The device check (benchmarks/gpu.py) runs its whole flow on CPU, so the script a GPU machine
gets has run before it travels there; its CUDA-only checks are left out on CPU, by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support.common import REPO


def test_the_device_check_runs_end_to_end_on_cpu_and_finds_the_dataloader_bound_loop(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )

    result = json.loads(out.read_text())
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
    # The compiled model's first window holds its compilation, the later one none (what the trace records, not
    # step times: beside other work on two cores a steady step took 1.5 s, twice the compiling one).
    first, steady = result["warm_up"]["first_steps"], result["warm_up"]["steady"]
    assert (first["state"], steady["state"]) == ("DONE", "DONE")
    assert first["compile_spans"] > 0 and steady["compile_spans"] == 0
    # CUDA-only checks are absent on CPU, not passed vacuously.
    assert ("oom" in result, "memory_snapshot" in result) == (torch.cuda.is_available(),) * 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run, not refuse")
def test_the_device_check_refuses_cuda_on_a_machine_without_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--out", str(tmp_path / "x.json")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2 and "no CUDA device here" in done.stderr
