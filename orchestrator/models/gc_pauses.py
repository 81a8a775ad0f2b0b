"""Python's cyclic garbage collections over a window: what the agent writes into its trace's top-level metadata under
:data:`GC_METADATA_KEY` and the analysis reads back.

A collection stops the process's Python for as long as it walks the objects of the generations it collects: a full
one walks every container object the process holds (a dataset kept as Python dicts, a large model's modules), and
takes tens to hundreds of milliseconds. A trace shows none of it: the pause lands inside whatever op or line
allocated when the collector ran, and reads as a slower forward or a slower rank. The collector's own callbacks
(``gc.callbacks``) say when each collection ran and how long it took, for the window only.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.models.common import StrictModel

__all__ = ["GC_METADATA_KEY", "GcCollection", "GcPauses", "GcTotal"]

GC_METADATA_KEY = "rayprof_gc"


class GcCollection(StrictModel):
    """One collection long enough to be recorded on its own."""

    start_us: int = Field(ge=0, description="When it began, unix time in microseconds.")
    ms: float = Field(ge=0, allow_inf_nan=False, description="How long it took by the clock.")
    cpu_ms: float | None = Field(
        default=None, ge=0, allow_inf_nan=False,
        description="The collecting thread's CPU time over it: the collector's own work. The rest of ``ms`` the "
        "thread waited for a core (or, its callbacks being Python, for the GIL); None in traces of agents before it.",
    )
    generation: int = Field(ge=0, le=2, description="The oldest generation it collected (2: a full collection).")
    explicit: bool = Field(
        description="Called by code (gc.collect()) rather than started by the collector's thresholds: read from the "
        "collector's allocation count as it starts (checked on CPython 3.11), or any collection while automatic collection is off."
    )
    caller: str | None = Field(
        default=None,
        description="For an explicit collection, the Python line that called it, named as a with_stack trace names "
        "frames ('train.py(88): train_step'); None for the collector's own (they start at whatever line allocated).",
    )
    training_thread: bool = Field(description="It ran on the training thread (another thread's holds the GIL meanwhile).")

    @property
    def pause_ms(self) -> float:
        """What the collection cost the training thread. On that thread, its CPU time where recorded: a collection
        walks objects, all CPU work, and the thread's waits for a core inside it are the scheduler's, told by the
        thread clock (two ranks beside a test run on two cores timed collections of 33 ms of work at 98 ms by the
        clock, a loop beside two spinning processes young ones of 0.1 ms at 2-12 ms). On another thread, its time by
        the clock: that thread holds the GIL throughout, preempted or not. Traces without the CPU time: the clock."""
        return self.ms if self.cpu_ms is None or not self.training_thread else min(self.cpu_ms, self.ms)


class GcTotal(StrictModel):
    """Every collection of one generation in the window, recorded on its own or not."""

    generation: int = Field(ge=0, le=2)
    count: int = Field(ge=0)
    ms: float = Field(ge=0, allow_inf_nan=False)


class GcPauses(StrictModel):
    """The collections of one window, from its first step's start to its last step's end."""

    enabled: bool = Field(description="Automatic collection was on as the window began (gc.isenabled()).")
    thresholds: tuple[int, int, int] = Field(description="gc.get_threshold() as the window began.")
    frozen: int = Field(ge=0, description="Objects gc.freeze() had moved out of every collection's walk (gc.get_freeze_count()).")
    min_recorded_ms: float = Field(ge=0, allow_inf_nan=False, description="Collections from this long on are recorded one by one.")
    collections: list[GcCollection] = Field(default_factory=list, description="In time order.")
    totals: list[GcTotal] = Field(default_factory=list, description="Per generation collected, all collections.")
    truncated: bool = Field(default=False, description="Recording one by one stopped at its cap; the totals go on.")
