"""The agent's clock of the training thread over a window, and how it reaches the trace."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

from actors.agent.capture import Capture
from actors.agent.thread_clock import ThreadClock
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY, ThreadTime
from tests.support.tracefiles import load_trace
from tests.unit.test_capture import INFO, _train, _window

LINUX = sys.platform.startswith("linux")


def _timed(work) -> ThreadTime:
    """What a clock started and stopped around ``work`` on a thread of its own says."""
    seen: list[ThreadTime] = []

    def run() -> None:
        clock = ThreadClock()
        work()
        seen.append(clock.stop())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    return seen[0]


def test_a_sleeping_thread_is_off_a_cpu_for_most_of_its_time():
    t = _timed(lambda: time.sleep(0.05))
    assert t.wall_s >= 0.05 and t.cpu_s < t.wall_s / 2


@pytest.mark.skipif(not LINUX, reason="context switches are counted per thread on Linux only (RUSAGE_THREAD)")
def test_a_thread_that_sleeps_gives_its_core_up_of_its_own_accord():
    t = _timed(lambda: [time.sleep(0.001) for _ in range(5)])
    assert t.voluntary_switches is not None and t.voluntary_switches >= 5
    assert t.involuntary_switches is not None


def test_the_cpu_time_counts_the_thread_alone_and_never_exceeds_its_wall_time():
    # Another thread spins meanwhile: its CPU time is the process's, not the measured thread's, which sleeps.
    done = threading.Event()
    limit = time.monotonic() + 10

    def spin() -> None:
        while not done.is_set() and time.monotonic() < limit:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        t = _timed(lambda: time.sleep(0.05))
    finally:
        done.set()
        spinner.join(timeout=30)
    assert 0 <= t.cpu_s <= t.wall_s and t.cpu_s < 0.025


def test_it_says_the_cores_the_process_may_use_and_torchs_threads():
    t = _timed(lambda: None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert t.usable_cores == cores and t.intra_op_threads == torch.get_num_threads()


def test_the_window_writes_its_thread_time_into_the_trace(tmp_path):
    _train(Capture(_window(tmp_path, start=2, steps=2), INFO, lambda e: None, lambda: None), range(1, 6))
    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    t = ThreadTime.model_validate(trace[THREAD_TIME_METADATA_KEY])
    assert 0 <= t.cpu_s <= t.wall_s


@pytest.mark.skipif(not LINUX, reason="page faults per thread are counted by Linux's RUSAGE_THREAD only")
def test_memory_the_thread_touches_for_the_first_time_counts_as_page_faults_and_kernel_time():
    def touch() -> None:
        fresh = bytearray(64 << 20)  # zero pages the kernel maps only when written
        for i in range(0, len(fresh), 4096):
            fresh[i] = 1

    t = _timed(touch)
    assert t.minor_faults is not None and t.minor_faults >= 1
    assert t.system_s is not None and 0 <= t.system_s <= t.wall_s
    idle = _timed(lambda: None)
    assert idle.minor_faults is not None and idle.minor_faults < t.minor_faults
