"""The whole-process idle benchmark says met or missed only when its own A/A control can tell,
and counts the CPU rayprof adds to a training process from what each job measured."""

from __future__ import annotations

import pytest

from benchmarks.idle_process import _added_cpu_pct, _verdict


def job(train_cpu_s: float, others_cpu_s: float, steps: int, hook_s: float = 0.0) -> dict:
    return {"train_cpu_s": train_cpu_s, "others_cpu_s": others_cpu_s, "steps": steps, "hook_s": hook_s}


def test_the_added_cpu_is_the_hook_per_step_plus_the_other_threads_beyond_the_plain_job():
    plain = job(train_cpu_s=10.0, others_cpu_s=0.10, steps=20_000)  # 500 us a step, others 1 %
    hooked = job(train_cpu_s=10.0, others_cpu_s=0.12, steps=20_000, hook_s=500e-9)  # others 1.2 %
    assert _added_cpu_pct(hooked, plain) == pytest.approx(0.1 + 0.2)


def test_a_plain_job_against_itself_adds_nothing():
    plain = job(train_cpu_s=8.0, others_cpu_s=0.09, steps=16_000)
    assert _added_cpu_pct(plain, plain) == 0.0


def test_a_wide_a_a_spread_leaves_the_target_unresolved_instead_of_met():
    row = _verdict("ratio", "x", [1.001] * 6, [0.8, 0.9, 1.0, 1.1, 1.2, 1.3], 1.0, 1.005, note="n")
    assert row.met is None and "cannot resolve 0.005" in row.note


def test_a_tight_a_a_spread_decides_met_or_missed_from_the_median():
    aa = [-0.02, 0.0, 0.01, 0.03, -0.01, 0.02]
    assert _verdict("added", "%", [0.1, 0.2, 0.3], aa, 0.0, 0.5, note="n").met is True
    assert _verdict("added", "%", [0.6, 0.7, 0.9], aa, 0.0, 0.5, note="n").met is False
