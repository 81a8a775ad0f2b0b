"""Who reads a device value back, named from the agent's stack samples where the trace has no Python stacks (every
window rayprof records samples the training thread; with_stack is off by default): a read long enough to be sampled
(on a device, one that waits for the work queued before it) is named by the innermost frame of the user's or a
library's code the samples taken during it hold. Lightning 2.6's SIGTERM broadcast, read back at every step's start,
is a library's read with its own story."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analysis import analyze_folder
from orchestrator.models.analysis import Finding
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from tests.support.realtraces import finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_idle_causes import kernel, launch

BASE_US = 1_700_000_000_000_000
STEP_US = 20_000
SIGTERM = [
    "lightning/pytorch/loops/training_epoch_loop.py(269): _TrainingEpochLoop._broadcast_sigterm_tensor",
    "lightning/pytorch/loops/training_epoch_loop.py(300): _TrainingEpochLoop.advance",
    "lightning/pytorch/loops/fit_loop.py(469): _FitLoop.advance",
    "train.py(40): main",
]
LOOP = ["lightning/pytorch/loops/fit_loop.py(469): _FitLoop.advance", "train.py(40): main"]


def _reads(tmp_path: Path, inside_read: list[str], steps: int = 4, sampled: int | None = None) -> Finding:
    """``steps`` steps of 20 ms: an 11 ms kernel, a read from 0.5 ms that waits for it until 11.5 ms, then 4.5 ms
    of Python before the next launch (the device idles), and a 4 ms kernel; a stack sample every 5 ms from 2 ms,
    ``inside_read`` while the read waits, the loop's own outside it; in steps after the first ``sampled`` (all by
    default) no sample falls in the read."""
    events: list[dict[str, Any]] = []
    for k in range(steps):
        o = k * STEP_US
        events += [
            x_event(f"ProfilerStep#{k + 1}", o, STEP_US - 10, cat="user_annotation"),
            launch(o, 2 * k + 1), kernel(o + 10, 11_000, 2 * k + 1),
            x_event("aten::item", o + 500, 11_000), x_event("aten::_local_scalar_dense", o + 505, 10_990),
            x_event("cudaStreamSynchronize", o + 510, 10_980, cat="cuda_runtime"),
            launch(o + 16_000, 2 * k + 2), kernel(o + 16_010, 3_900, 2 * k + 2),
        ]
    times = [2_000 + 5_000 * j for j in range(4 * steps)]
    samples = FrameSamples(
        interval_ms=5, stacks=[inside_read, LOOP],
        samples=[
            (BASE_US + t, 0 if 500 <= t % STEP_US < 11_500 else 1) for t in times
            if t // STEP_US < (steps if sampled is None else sampled) or not 500 <= t % STEP_US < 11_500
        ],
    )
    write_trace(
        tmp_path / "rank0.pt.trace.json", events, world_size=1, baseTimeNanoseconds=BASE_US * 1000,
        **{FRAMES_METADATA_KEY: samples.model_dump(mode="json")},
    )
    return finding(analyze_folder(tmp_path), "host_sync")


def test_a_read_that_waits_is_named_by_the_stack_samples_taken_while_it_waits(tmp_path: Path) -> None:
    found = _reads(tmp_path, ["metrics.py(12): log_accuracy", "train.py(30): train_step", "train.py(40): main"])
    assert "Made by (Python, innermost frame of your or a library's code): log_accuracy (metrics.py:12)" in found.evidence
    assert found.fix.startswith("The reads are mostly in log_accuracy (metrics.py:12) (1x per step): start there.")
    assert "with_stack=True" not in found.fix  # before: "To see which Python line reads, profile with with_stack=True."


def test_lightnings_sigterm_broadcast_read_back_every_step_is_told_as_lightnings(tmp_path: Path) -> None:
    found = _reads(tmp_path, SIGTERM)
    assert "code): _TrainingEpochLoop._broadcast_sigterm_tensor (lightning/.../training_epoch_loop.py:269) 1 a step" in found.evidence
    assert "Lightning's Trainer broadcasts a SIGTERM flag from rank 0 at the start of every training step" in found.fix
    assert "trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None" in found.fix


def test_a_read_the_samples_caught_in_one_step_of_three_is_said_so_not_zero_times_a_step(tmp_path: Path) -> None:
    # On the H200 a compiled transformer's synchronize, sampled in one step of three: "(0x per step): start there".
    found = _reads(tmp_path, ["metrics.py(12): log_accuracy", "train.py(30): train_step", "train.py(40): main"], 3, 1)
    assert found.fix.startswith("The reads are mostly in log_accuracy (metrics.py:12) (1 in 3 steps): start there.")
