"""The training thread's CPU time, context switches and page faults across a window, taken on that thread at the window's
first boundary and its last (:class:`orchestrator.models.thread_time.ThreadTime`): two system calls a window, none
between windows."""

from __future__ import annotations

import os
import resource
import time

import torch

from orchestrator.models.thread_time import ThreadTime

__all__ = ["ThreadClock"]

# Linux counts per thread; elsewhere the CPU time still comes from time.thread_time(), without switches.
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _usage() -> tuple[int, int, int, float] | None:
    """The thread's involuntary and voluntary switches, minor page faults and time in the kernel."""
    if _RUSAGE_THREAD is None:
        return None
    usage = resource.getrusage(_RUSAGE_THREAD)
    return usage.ru_nivcsw, usage.ru_nvcsw, usage.ru_minflt, usage.ru_stime


class ThreadClock:
    """Started on the training thread; :meth:`stop` must be called on the same thread."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._cpu = time.thread_time()
        self._usage = _usage()

    def stop(self) -> ThreadTime:
        """The thread's time since this clock started."""
        wall, cpu, usage = time.monotonic() - self._wall, time.thread_time() - self._cpu, _usage()
        moved = tuple(b - a for a, b in zip(self._usage, usage)) if usage and self._usage else None
        affinity = getattr(os, "sched_getaffinity", None)
        return ThreadTime(
            wall_s=wall,
            cpu_s=min(cpu, wall) if wall > 0 else 0.0,  # the two clocks' resolutions differ; a thread runs no faster than time
            involuntary_switches=int(moved[0]) if moved else None,
            voluntary_switches=int(moved[1]) if moved else None,
            minor_faults=int(moved[2]) if moved else None,
            system_s=min(max(moved[3], 0.0), wall) if moved else None,
            usable_cores=len(affinity(0)) if affinity is not None else os.cpu_count(),
            intra_op_threads=torch.get_num_threads(),
        )
