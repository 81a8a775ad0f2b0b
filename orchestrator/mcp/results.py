"""What the MCP tools answer: compact typed JSON an agent reasons over (each tool's output schema).

Built from the client's models by :mod:`orchestrator.mcp.convert`; every list is
ordered most important first so that :func:`orchestrator.mcp.bounds.cap` cuts the
least important items when an answer is over its budget.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.diff import Change, OpChange, PhaseChange
from orchestrator.models.analysis import Finding, IdleShare, PhaseTimes, SlowGroup, StepSpread, Straggler
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.profile import Trigger

__all__ = [
    "Analysis",
    "DiffResult",
    "HistoryResult",
    "ProfileList",
    "ProfileResult",
    "RankAnalysis",
    "RankNow",
    "RankOutcome",
    "RankPoints",
    "StacksResult",
    "TargetBrief",
    "TargetList",
    "WatchBrief",
    "WatchCreated",
    "WatchList",
]

_TRUNCATED = "Set when the answer was cut to its size cap: what was cut. Ask narrower to see the rest."


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Capped(_Result):
    truncated: str | None = Field(default=None, description=_TRUNCATED)


class RankNow(_Result):
    rank: int
    step: int
    step_time_ms: float | None = Field(description="Its latest step time.")


class TargetBrief(_Result):
    """One live run: its ranks' progress and health."""

    name: str
    run: str | None = Field(description="The Ray job of this run; pass it as `run` when two runs share a name.")
    world_size: int
    health: Literal["TRAINING", "STALLED"]
    stalled_s: float | None = Field(description="Seconds since any rank advanced, when STALLED.")
    median_step_time_ms: float | None
    lagging_ranks: list[int] = Field(description="Ranks steps behind the leader: look at them first.")
    active_profile: str | None = Field(description="The window running now; a profile without queue=true gets a 409.")
    queued_profiles: list[str]
    stall_stacks: str | None = Field(description="Stacks bundle taken when it turned STALLED (get_profile reads it).")
    stall_verdict: str | None = Field(
        description="Those stacks' verdict: ranks waiting in a collective are hung on the others; ranks evaluating or "
        "saving a checkpoint are slow, not hung."
    )
    other_build_ranks: list[int] = Field(
        default_factory=list,
        description="Ranks whose agent runs another rayprof build than the controller: restart the job if it started "
        "before an upgrade, or replace the controller (rayprof serve --replace-controller) if it did.",
    )
    ranks: list[RankNow] = Field(description="Furthest behind first, then slowest.")


class TargetList(_Capped):
    targets: list[TargetBrief]
    note: str | None = Field(default=None, description="When no run is live: how a run becomes a target.")


class RankAnalysis(_Result):
    """One rank of an analysed window: how long its steps took and where its time went."""

    rank: int
    mean_step_ms: float | None = Field(description="Mean step time: what phases_ms adds up to.")
    median_step_ms: float | None
    phases_ms: PhaseTimes = Field(description="Mean per step in each phase.")
    comm_wait_ms: float = Field(description="Mean per step this rank waited in collectives.")
    waits_for_others_ms: float = Field(description="Mean per step it waited for other ranks (a fast rank waits).")
    idle_ms_per_step: float | None = Field(description="Device idle time per step (device traces only).")
    idle_causes: list[IdleShare] = Field(description="Device idle per step by cause, largest first.")


class Analysis(_Capped):
    """A window's analysis: findings with what fixing each could save, stragglers, per-rank times."""

    profile_id: str
    steps: list[int] = Field(description="Steps analysed on every rank.")
    one_step: str | None = Field(
        default=None, description="What one step is: what the agent counted and what the trace's steps hold."
    )
    verdict: str = Field(
        description="The analysis in one line: the largest warning and what fixing it saves, or that nothing warns.",
    )
    caution: str | None = Field(
        default=None,
        description="Read before any figure: the profiler slowed the steps it recorded (how much, and why it may have).",
    )
    findings: list[Finding] = Field(description="Largest possible saving first.")
    stragglers: list[Straggler] = Field(description="Ranks that hold the others back, and in which phase.")
    slow_groups: list[SlowGroup] = Field(
        default_factory=list, description="Process groups whose collectives are slower than their peers': a slow link inside."
    )
    step_spread: StepSpread | None
    ranks: list[RankAnalysis]
    issues: list[str] = Field(
        description="Notes, in words: what the analysis could not do, and what the window holds that no finding says "
        "(one step analysed; a step that saves or evaluates before it fetches its batch)."
    )
    analysis_error: str | None = None


class RankOutcome(_Result):
    rank: int
    state: str
    reason: str | None = None
    steps_recorded: int


class ProfileResult(_Capped):
    """A profile (or stacks bundle) by id: its state, per-rank outcome, and once ended its analysis."""

    id: str
    kind: Literal["profile", "stacks"]
    target: str
    run: str | None
    state: str
    reason: str | None
    trigger: Trigger | None = Field(description="The watch or stall detector that took it, if any.")
    start_step: int | None
    stop_step: int | None
    ranks: list[RankOutcome]
    manifest_uri: str | None = Field(description="Where the manifest is stored (credentials removed).")
    manifest_resource: str | None = Field(description="The manifest as an MCP resource (compact JSON).")
    report_resource: str | None = Field(description="The report as an MCP resource (text).")
    analysis: Analysis | None = Field(description="Findings and per-rank times, once the profile ended.")
    next: str = Field(description="What to do next, in words.")


class ProfileBrief(_Result):
    id: str
    kind: Literal["profile", "stacks"]
    target: str
    state: str
    created_at: datetime
    steps: int | None
    trigger: str | None = Field(description="The trigger's kind when a watch or the stall detector took it.")


class ProfileList(_Capped):
    total: int
    profiles: list[ProfileBrief] = Field(description="Newest first.")


class StackGroupBrief(_Result):
    ranks_text: str
    where: str = Field(description="Where the training thread is, in words.")
    waiting: bool = Field(description="Its innermost frame is torch.distributed's: waiting on other ranks.")
    activity: str | None = Field(
        description="What its frames say it is doing: evaluating, saving or loading a checkpoint, compiling, "
        "fetching a batch (a STALLED run that is evaluating is no hang)."
    )
    majority: bool
    frames: list[str] = Field(description="Innermost first: 'file:line in function'.")


class StacksResult(_Capped):
    """Every live rank's stacks, grouped (ranks unlike the majority first), and the verdict."""

    id: str = Field(description="The stored bundle (get_profile reads it again).")
    target: str
    verdict: str = Field(description="One line: ranks that differ from the majority first, and where.")
    health: Literal["TRAINING", "STALLED"] | None = Field(description="The target's health when taken.")
    stalled_s: float | None
    groups: list[StackGroupBrief]
    collectives: list[str] = Field(description="Collectives some ranks never joined: the usual hang.")
    missing: list[str] = Field(description="Ranks that gave no stacks, and why.")


class RankDiffBrief(_Result):
    rank: int
    step_time: Change


class DiffResult(_Capped):
    """Profile b (after) against profile a (before), with the significance of each change."""

    a: str
    b: str
    comparable: bool
    not_comparable: list[str] = Field(description="Why a change cannot be claimed.")
    claims: list[str] = Field(description="What changed, one sentence each (significant changes only).")
    step_time: Change
    phases: list[PhaseChange]
    ranks: list[RankDiffBrief]
    ops: list[OpChange] = Field(description="Largest change first.")
    kernels: list[OpChange]
    resolved_findings: list[str]
    new_findings: list[str]


class RankPoints(_Result):
    rank: int
    t: list[float] = Field(description="Unix time of each point.")
    step_time_ms: list[float | None] = Field(description="Mean step time in each point; null when none.")
    median_step_time_ms: float | None


class HistoryResult(_Capped):
    """Step time per rank over the span, downsampled to at most ``max_points`` per rank."""

    target: str
    run: str | None
    span_s: float
    resolution_s: float = Field(description="Width of one point after downsampling.")
    ranks_total: int = Field(description="Ranks with points in the span; more than listed when the server kept the slowest.")
    ranks: list[RankPoints] = Field(description="Slowest median first.")


class WatchBrief(_Result):
    id: str
    spec: WatchSpec
    state: str
    observed: float | None
    baseline: float | None
    note: str | None
    last_firings: list[str] = Field(description="Newest first: when, what it took, or why it could not.")


class WatchList(_Capped):
    watches: list[WatchBrief]


class WatchCreated(_Capped):
    watch: WatchBrief
