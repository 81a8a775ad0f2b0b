"""What the profiler cost the steps it recorded: the window's steps against the rank's steps just before it.

The agent writes the rank's step time just before the window into the trace (:mod:`orchestrator.models.pace`). A
window whose steps run far slower than that describes profiled steps: what the profiler adds to each op reads as
the job's own host time, and every host-side figure and saving in the report is of a job the profiler slowed. The
summary's ``caution`` then says so, before the verdict: how much, whether it was the process's first window, the
training thread's time in the kernel, what each option on adds. A job that changed pace of its own as the window
opened reads the same; the post-window check (steps after against before) tells the two apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.analysis.finding_base import ranks_text
from orchestrator.analysis.trace_metadata import read_metadata
from orchestrator.models.analysis import RankSummary
from orchestrator.models.pace import STEPS_BEFORE_METADATA_KEY, StepsBefore

__all__ = ["KERNEL_SHARE", "SLOWED", "median_slowdown", "profiler_cost_note", "read_steps_before", "slowdown", "slowed_by_profiler"]

# The ranks' median of window step / step before it from which the report says the profiler slowed the steps. The
# measure before is a mean over whole seconds (data loading, logging, evaluations in it), so a window's median at
# half as much again is past the loop's own spread: a LoRA fine-tune's window ran 0.97x its steps before without record_shapes,
# 1.06-8.8x with it; the example job's first windows 1.5-3.5x (`make demo`: 1.95x with its threads 40 ms of an 83 ms
# step in the kernel), its later ones 0.75-1.15x (against steps the last window's export and analysis still slowed).
SLOWED = 1.5
# The share of the window's step the training thread's time in the kernel must reach to be said: on this
# repository's VMs the first touch of memory took 27-35 ms of a 120 ms step in a record_shapes window (~100k faults).
KERNEL_SHARE = 0.1
# A window of one step is a one-off as likely as a pace (its own note says so).
_MIN_STEPS = 2
# What each per-op option adds, in the note's words.
_OPTION_COSTS = {
    "record_shapes": "holds a reference to each op's tensors until the window closes (torch.profiler's docs), so "
    "tensors reused in place are copied and memory grows with every recorded step",
    "with_stack": "records each op's Python stack",
    "profile_memory": "records every allocation and free",
    "with_flops": "works out each op's flops from its input shapes",
    "with_modules": "records each op's module hierarchy",
}


def read_steps_before(header: Mapping[str, Any]) -> tuple[StepsBefore | None, str | None]:
    """A trace's steps before its window (None where the agent wrote none), and why it was not read where malformed."""
    return read_metadata(header, STEPS_BEFORE_METADATA_KEY, StepsBefore, "steps before the window")


def slowdown(r: RankSummary) -> float | None:
    """The rank's median window step over its step time just before the window (None: either is unknown)."""
    b = r.steps_before
    if b is None or r.median_step_ms is None or len(r.steps) < _MIN_STEPS:
        return None
    return r.median_step_ms / b.step_ms


def median_slowdown(ranks: Sequence[RankSummary]) -> float | None:
    """The ranks' median :func:`slowdown` (None: no rank has one)."""
    measured = [x for r in ranks if (x := slowdown(r)) is not None]
    return statistics.median(measured) if measured else None


def slowed_by_profiler(label: str, ranks: Sequence[RankSummary]) -> str | None:
    """Why a diff cannot claim a change where the profiler slowed ``label``'s steps (None: it did not)."""
    median = median_slowdown(ranks)
    if median is None or median < SLOWED:
        return None
    return f"the profiler slowed the steps of {label} ({median:.1f}x its steps before the window): a change may be its"


def profiler_cost_note(ranks: Sequence[RankSummary]) -> str | None:
    """The note that the window's steps are the profiler's more than the job's, where the ranks' median slowdown
    reaches :data:`SLOWED`; None otherwise."""
    median = median_slowdown(ranks)
    if median is None or median < SLOWED:
        return None
    measured = [(r, x) for r in ranks if (x := slowdown(r)) is not None]
    r, worst = max(measured, key=lambda m: m[1])
    b = r.steps_before
    assert b is not None and r.median_step_ms is not None
    slowed = [m[0] for m in measured if m[1] >= SLOWED]
    across = f"; the ranks' median {median:.1f}x, {ranks_text(slowed)} over {SLOWED:g}x" if len(measured) > 1 else ""
    return (
        f"the profiler slowed the steps it recorded: {r.median_step_ms:.1f} ms a step in the window (median) against "
        f"{b.step_ms:.1f} ms over the {b.steps} steps ({b.span_s:.1f} s) just before it on rank {r.rank} "
        f"({worst:.1f}x{across}). Every figure and saving below is of profiled steps, where what the profiler adds to "
        f"each op reads as the job's host time. {_kernel(r)}{_causes(b)}"
    )


def _kernel(r: RankSummary) -> str:
    """What the training thread spent in the kernel a step, where that is a part of the step worth saying."""
    t = r.thread_time
    if t is None or t.system_s is None or not r.steps or r.median_step_ms is None:
        return ""
    ms = t.system_s * 1000 / len(r.steps)
    if ms < KERNEL_SHARE * r.median_step_ms:
        return ""
    faults = f" ({t.minor_faults:,} page faults in the window)" if t.minor_faults else ""
    return (
        f"Its training thread spent {ms:.1f} ms a step in the kernel{faults}: most often memory new to the process, "
        "touched for the first time (the profiler's records, and tensors it holds), which costs that much on this host. "
    )


def _causes(b: StepsBefore) -> str:
    costs = "; ".join(f"{name}=True, which {_OPTION_COSTS.get(name, 'adds to each op')}" for name in b.options)
    without = " and ".join(b.options)
    if b.windows_before == 0:
        return (
            "It was the process's first window, whose records take memory new to the process (a later one reuses it): "
            "profile the same steps again to see how much stays (the example job's first windows ran 1.5-3.5x its pace)."
            + (f" It also recorded with {costs}: if a second window is slow too, profile without {without}." if costs else "")
        )
    if costs:
        return f"It recorded with {costs}: profile again without {without} for the job's own pace."
    return (
        "It recorded no option that adds to each op's cost: the profiler's own record of each op is what slowed a loop "
        "of many small host ops; the device's kernels keep their time, the host's do not."
    )
