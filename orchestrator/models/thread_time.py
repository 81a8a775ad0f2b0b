"""The training thread's time on a CPU over a window: what the agent writes into its trace's top-level metadata
under :data:`THREAD_TIME_METADATA_KEY` and the analysis reads back.

A trace shows when the training thread was inside an op, not whether it ran on a core meanwhile: a rank whose
thread shares its cores with other processes (more ranks, DataLoader workers or other jobs than the host has cores)
is preempted in the middle of its forward, and its trace reads as a slower forward, the same as one that got more
data. The thread's CPU time and its involuntary context switches over the window tell the two apart, for the cost
of two system calls a window.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["THREAD_TIME_METADATA_KEY", "ThreadTime"]

THREAD_TIME_METADATA_KEY = "rayprof_thread_time"


class ThreadTime(StrictModel):
    """The training thread over one window's recorded steps, from its first step's start to its last step's end."""

    wall_s: float = Field(ge=0, allow_inf_nan=False, description="Time the window's steps took.")
    cpu_s: float = Field(ge=0, allow_inf_nan=False, description="The thread's CPU time (user and system) in them.")
    involuntary_switches: int | None = Field(
        default=None, ge=0,
        description="Times the scheduler took a core from the thread while it could still run (preemptions); None "
        "where the system does not count per thread (getrusage's RUSAGE_THREAD is Linux's).",
    )
    voluntary_switches: int | None = Field(
        default=None, ge=0, description="Times the thread gave up its core to wait (a lock, I/O, a sleep, a collective)."
    )
    minor_faults: int | None = Field(
        default=None, ge=0,
        description="Page faults the thread took that needed no disk: memory new to the process, touched for the first "
        "time (None where the system does not count per thread, or an agent before this field wrote it).",
    )
    system_s: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="The part of cpu_s the thread spent in the kernel."
    )
    usable_cores: int | None = Field(default=None, ge=1, description="Cores the process may run on (its affinity).")
    intra_op_threads: int = Field(ge=1, description="torch.get_num_threads() in the window.")
