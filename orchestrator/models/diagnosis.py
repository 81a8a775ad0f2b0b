"""Models of stuck and slowing jobs: every rank's stacks, and watches that act on a condition."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from orchestrator.models.common import Name, StrictModel
from orchestrator.models.profile import Artifact, Trigger
from orchestrator.models.requests import ProfileState

__all__ = [
    "Collective",
    "Frame",
    "MissingRank",
    "RankNote",
    "RankStacks",
    "SafeText",
    "StackGroup",
    "StacksBundle",
    "ThreadStack",
    "WatchFiring",
    "WatchSpec",
    "WatchStatus",
    "duration_text",
    "safe_text",
]

_SURROGATE = re.compile("[\ud800-\udfff]")


def safe_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD.

    A file or thread name the OS gave as undecodable bytes arrives as surrogate
    escapes, which no UTF-8 write (JSON, a text file) accepts: one such name
    failed the whole bundle.
    """
    return _SURROGATE.sub("\ufffd", text)


def duration_text(seconds: float) -> str:
    """``1800`` -> ``30m``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s``: a duration as the CLI takes it."""
    whole = round(seconds)
    if whole != seconds or whole == 0:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


# Text a rank sends: made writable where a model is built (the agent) or re-validated (the controller).
SafeText = Annotated[str, AfterValidator(safe_text)]


class Frame(StrictModel):
    """One Python frame."""

    filename: SafeText
    line: int
    function: SafeText
    code: SafeText | None = Field(default=None, description="The source line, where readable.")
    library: bool = Field(default=False, description="In the standard library or an installed package.")


class ThreadStack(StrictModel):
    """One thread's Python stack, outermost frame first."""

    thread_id: int
    name: SafeText
    training: bool = Field(default=False, description="The thread that runs the training loop.")
    frames: list[Frame]


class Collective(StrictModel):
    """One collective from a rank's torch flight recorder."""

    process_group: SafeText
    seq: int
    op: SafeText
    completed: bool


class RankStacks(StrictModel):
    """Agent -> controller: one rank's answer to a ``stacks`` command."""

    bundle_id: str
    agent_id: str
    step: int
    taken_at: datetime
    threads: list[ThreadStack]
    native: SafeText | None = Field(default=None, description="py-spy dump --native output, its header cut.")
    native_note: SafeText | None = Field(default=None, description="Why native frames are missing, when asked for.")
    collectives: list[Collective] = Field(default_factory=list, description="Last flight recorder entries.")
    flight_recorder: SafeText | None = Field(default=None, description="The flight recorder dump (JSON), when kept.")
    flight_recorder_note: SafeText | None = None
    truncated: SafeText | None = Field(default=None, description="What was cut to keep the answer under its limit.")
    artifacts: list[Artifact] = Field(
        default_factory=list, description="The rank's CUDA allocator snapshot and its page, when asked for and stored."
    )
    memory_note: SafeText | None = Field(default=None, description="Why the snapshot asked for is missing.")


class StackGroup(StrictModel):
    """Ranks whose training thread is in the same place."""

    ranks: list[int]
    ranks_text: str = Field(description="'rank 1', 'ranks 0, 2-7'.")
    where: str = Field(description="Where the training thread is, in words.")
    waiting: bool = Field(
        description="Its innermost frame is torch.distributed's (a collective, a barrier, a store): waiting on other ranks."
    )
    activity: str | None = Field(
        default=None,
        description="What its frames say it is doing, where code rayprof knows says so, outermost first, and where the "
        "innermost begins: 'evaluating (trainer.py:2871 in evaluate)', 'evaluating › saving a checkpoint (...)'; "
        "evaluating, saving or loading a checkpoint, compiling with torch.compile, fetching a batch from a DataLoader.",
    )
    majority: bool
    frames: list[Frame]


class MissingRank(StrictModel):
    """A rank that did not answer, and why."""

    rank: int
    reason: str


class RankNote(StrictModel):
    """Something to know about one rank's part of a bundle."""

    rank: int
    note: str


class StacksBundle(StrictModel):
    """Every rank's stacks, grouped; ``stacks.json`` of a bundle of kind ``stacks``."""

    id: str
    target: str
    run: str | None = None
    state: ProfileState
    summary: str = Field(description="One line: ranks that differ from the majority first.")
    groups: list[StackGroup] = Field(description="Outliers first, the majority last.")
    missing: list[MissingRank] = Field(default_factory=list)
    truncated: list[RankNote] = Field(
        default_factory=list, description="Ranks whose answer was cut to RAYPROF_STACKS_MAX_RANK_BYTES, and what was cut."
    )
    collectives: list[str] = Field(default_factory=list, description="Collectives some ranks never joined.")
    flight_recorder_note: str | None = None
    native_notes: list[str] = Field(default_factory=list)
    memory_notes: list[RankNote] = Field(
        default_factory=list, description="Ranks whose memory snapshot, asked for, is missing, and why."
    )
    storage_uri: str
    manifest_uri: str | None = None
    trigger: Trigger | None = None
    taken_at: datetime
    finished_at: datetime


class WatchSpec(StrictModel):
    """``POST /v1/watches``: a condition on a target and what to do when it holds.

    Exactly one condition: ``slower_than`` (median step time over the rolling
    baseline), ``rank_lag`` (a rank this many steps behind the leader),
    ``stalled``, ``every_s`` (a schedule: due at creation, then this long
    after each firing, while the target is live), or ``oom`` (a rank ran out of
    CUDA memory: while the watch exists every rank records the allocator's
    history, and the action, ``stacks``, stores every rank's snapshot with its
    stacks). The action: ``profile`` (a window of ``profile_steps`` steps) or ``stacks``.
    """

    target: Name
    slower_than: float | None = Field(
        default=None, gt=1, le=100, allow_inf_nan=False, description="Ratio of step time to the baseline."
    )
    rank_lag: int | None = Field(default=None, ge=1, description="Steps behind the leading rank.")
    stalled: bool = False
    oom: bool = Field(
        default=False,
        description="A rank's CUDA allocator could not satisfy an allocation: every rank's stacks and allocator "
        "snapshot in one bundle (action stacks).",
    )
    every_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="A schedule: seconds between firings, at least 60 and within the cooldown and hourly cap "
        "(checked at creation).",
    )
    for_s: float = Field(default=30.0, ge=0, le=86400, description="How long the condition must hold; not for a schedule.")
    action: Literal["profile", "stacks"] = "profile"
    profile_steps: int = Field(default=5, ge=1, description="At most RAYPROF_MAX_STEPS (checked at creation).")
    ranks: Literal["all", "lagging"] = Field(
        default="all", description="lagging: profile the lagging ranks plus up to 2 healthy ones (rank_lag only)."
    )
    baseline_s: float = Field(default=300.0, ge=10, le=86400, description="Rolling window of the baseline median (slower_than).")
    cooldown_s: float = Field(default=600.0, ge=0, le=86400)
    max_per_hour: int = Field(default=4, ge=1, le=60)

    @model_validator(mode="after")
    def _one_condition(self) -> WatchSpec:
        conditions = [self.slower_than is not None, self.rank_lag is not None, self.stalled, self.every_s is not None, self.oom]
        if sum(conditions) != 1:
            raise ValueError("give exactly one condition: slower_than, rank_lag, stalled, every_s or oom")
        if self.oom and self.action != "stacks":
            raise ValueError("an oom watch takes every rank's stacks and memory snapshots: set action='stacks'")
        if self.ranks == "lagging" and self.rank_lag is None:
            raise ValueError("ranks='lagging' needs rank_lag")
        return self

    @property
    def condition(self) -> Literal["slower_than", "rank_lag", "stalled", "schedule", "oom"]:
        """The condition's kind, as a firing's trigger names it."""
        if self.oom:
            return "oom"
        if self.slower_than is not None:
            return "slower_than"
        if self.rank_lag is not None:
            return "rank_lag"
        return "stalled" if self.stalled else "schedule"


class WatchFiring(StrictModel):
    """One time a watch ran its action."""

    at: datetime
    profile_id: str | None = None
    trigger: Trigger
    error: str | None = Field(default=None, description="Why the action could not run.")


class WatchStatus(StrictModel):
    """A watch as the controller holds it now."""

    id: str
    spec: WatchSpec
    created_at: datetime
    state: Literal["WAITING", "HOLDING", "COOLDOWN", "CAPPED", "PAUSED"] = Field(
        description="WAITING: condition not met (a schedule: not due, see next_at); HOLDING: met, not yet for "
        "long enough (a schedule: due, firing); COOLDOWN / CAPPED: "
        "it fired (or tried to) and waits for the cooldown or the hourly cap; PAUSED: its action failed "
        "RAYPROF_WATCH_MAX_FAILURES times in a row (see paused)."
    )
    baseline: float | None = Field(default=None, description="Baseline step time (s), for slower_than.")
    observed: float | None = Field(default=None, description="The value the condition compares now.")
    holding_s: float | None = Field(default=None, description="How long the condition has held.")
    next_at: datetime | None = Field(
        default=None,
        description="A schedule's next firing: its creation, then its last firing (or failed try) plus every_s; "
        "one due while the target is not live happens when it is.",
    )
    note: str | None = None
    firings: list[WatchFiring] = Field(default_factory=list, description="Newest last; the last 20.")
    fired_at: list[datetime] = Field(
        default_factory=list,
        description="When it fired or tried to, oldest first, at most max_per_hour of them: what the hourly cap "
        "and the cooldown count, failed firings included.",
    )
    failures: int = Field(default=0, ge=0, description="Failed firings in a row.")
    paused: str | None = Field(
        default=None, description="Why it no longer acts; it stays PAUSED until deleted and created again."
    )
