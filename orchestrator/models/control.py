"""What the control actor reports and runs with: live targets and their workers, its configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.models.agent_protocol import StorageSpec, WorkerInfo
from orchestrator.models.common import Name, StrictModel
from orchestrator.settings import (
    DEFAULT_CLUSTER_NAME_LEASE_S,
    DEFAULT_ENDED_RUN_KEPT_S,
    DEFAULT_GC_GRACE_HOURS,
    DEFAULT_HISTORY,
    DEFAULT_HISTORY_SAVE_INTERVAL_S,
    DEFAULT_LAG_STEPS,
    DEFAULT_MAX_WATCHES,
    DEFAULT_METRICS,
    DEFAULT_METRICS_ENDED_KEPT_S,
    DEFAULT_MONITOR_INTERVAL_S,
    DEFAULT_OWNER_LEASE_S,
    DEFAULT_POST_WINDOW_SLOWDOWN,
    DEFAULT_POST_WINDOW_STEPS,
    DEFAULT_RETENTION_AUTO_COUNT,
    DEFAULT_STACKS_MAX_RANK_BYTES,
    DEFAULT_STACKS_TIMEOUT_S,
    DEFAULT_STALL_AUTO_STACKS,
    DEFAULT_STALL_MIN_S,
    DEFAULT_STALL_STEP_FACTOR,
    DEFAULT_WATCH_MAX_FAILURES,
    MAX_GC_GRACE_HOURS,
    MIN_STACKS_MAX_RANK_BYTES,
)

__all__ = ["HOW_A_RUN_APPEARS", "ControllerConfig", "TargetInfo", "WorkerStatus", "known_targets", "no_targets_note"]

HOW_A_RUN_APPEARS = (
    "a run is listed once its Ray Train workers take an optimizer step with the rayprof agent installed "
    "(runtime_env worker_process_setup_hook 'actors.agent.install', or agent.attach() in the train function) "
    "and reach this controller"
)
"""What makes a run a target, said wherever none is (the CLI, the API's and MCP's lists, the console, an unknown
target's error)."""


def no_targets_note(count: int) -> str | None:
    """What a list of ``count`` live targets says beside them: how a run becomes one, where there is none."""
    return None if count else f"no live training run: {HOW_A_RUN_APPEARS}"


def known_targets(names: list[str]) -> str:
    """The live targets' names for an error message, or that there are none and how a run becomes one."""
    return ", ".join(repr(n) for n in sorted(names)) if names else f"none ({HOW_A_RUN_APPEARS})"


class WorkerStatus(StrictModel):
    """A registered worker and its progress."""

    info: WorkerInfo
    step: int
    step_time_s: float | None
    step_definition: str | None = Field(default=None, description="What one step is, e.g. '1 step = Adam.step ×2; 2 forward passes (Net)'.")
    last_seen_s: float = Field(description="Seconds since the last heartbeat.")
    advanced_s: float | None = Field(default=None, description="Seconds since its step last advanced.")
    steps_behind: int | None = Field(default=None, description="Steps behind the leading rank, at one instant.")


class TargetInfo(StrictModel):
    """A live Ray Train run that agents registered."""

    name: Name
    run: str | None = Field(default=None, description="The Ray job (submission id or job id) of this run.")
    world_size: int
    ranks: list[WorkerStatus]
    active_profile: str | None = None
    queued_profiles: list[str] = Field(default_factory=list)
    health: Literal["TRAINING", "STALLED"] = "TRAINING"
    stalled_s: float | None = Field(default=None, description="Seconds since any rank advanced, when STALLED.")
    stall_threshold_s: float | None = Field(default=None, description="max(stall min, factor x median step time).")
    median_step_time_s: float | None = None
    lagging_ranks: list[int] = Field(default_factory=list, description="Ranks at least RAYPROF_LAG_STEPS behind.")
    stall_stacks: str | None = Field(default=None, description="The stacks taken when it turned STALLED.")
    stall_verdict: str | None = Field(
        default=None,
        description="Those stacks' one-line verdict: where the ranks are, and what their frames say they are doing "
        "(a run evaluating or saving for longer than the threshold is slow, not hung).",
    )
    other_build_ranks: list[int] = Field(
        default_factory=list,
        description="Ranks whose agent runs another rayprof build than the controller: the job or the controller "
        "started before an upgrade, and each keeps its code until it restarts.",
    )


class ControllerConfig(StrictModel):
    """Server-side settings of the control actor; see ``orchestrator.settings``."""

    storage: StorageSpec
    max_steps: int = Field(ge=1)
    max_warmup_steps: int = Field(ge=0)
    poll_timeout_s: float = Field(gt=0)
    worker_expiry_grace_s: float = Field(ge=0)
    arm_lead_s: float = Field(ge=0)
    sync_timeout_s: float = Field(gt=0)
    request_timeout_s: float = Field(gt=0)
    max_request_timeout_s: float = Field(gt=0)
    max_trace_bytes: int = Field(ge=1)
    max_queued_per_target: int = Field(ge=0)
    postprocess_timeout_s: float = Field(gt=0)
    retention_count: int = Field(ge=1)
    retention_days: float = Field(gt=0)
    retention_auto_count: int = Field(
        default=DEFAULT_RETENTION_AUTO_COUNT, ge=1, description="Automatic bundles and profiles kept (watches, stalls)."
    )
    cluster_name: str | None = Field(default=None, description="Namespace of saved state; default the Ray cluster id.")
    cluster_name_lease_s: float = Field(
        default=DEFAULT_CLUSTER_NAME_LEASE_S, gt=0, description="How long the cluster name's lease lasts unrenewed."
    )
    stacks_timeout_s: float = Field(default=DEFAULT_STACKS_TIMEOUT_S, gt=0)
    stacks_max_rank_bytes: int = Field(default=DEFAULT_STACKS_MAX_RANK_BYTES, ge=MIN_STACKS_MAX_RANK_BYTES)
    stall_min_s: float = Field(default=DEFAULT_STALL_MIN_S, gt=0)
    stall_step_factor: float = Field(default=DEFAULT_STALL_STEP_FACTOR, ge=0)
    stall_auto_stacks: bool = Field(default=bool(DEFAULT_STALL_AUTO_STACKS))
    lag_steps: int = Field(default=DEFAULT_LAG_STEPS, ge=1)
    monitor_interval_s: float = Field(default=DEFAULT_MONITOR_INTERVAL_S, gt=0)
    max_watches: int = Field(default=DEFAULT_MAX_WATCHES, ge=0)
    watch_max_failures: int = Field(default=DEFAULT_WATCH_MAX_FAILURES, ge=1)
    gc_grace_hours: float = Field(default=DEFAULT_GC_GRACE_HOURS, gt=0, le=MAX_GC_GRACE_HOURS)
    owner_lease_s: float = Field(default=DEFAULT_OWNER_LEASE_S, gt=0)
    metrics: bool = Field(default=bool(DEFAULT_METRICS))
    metrics_ended_kept_s: float = Field(
        default=DEFAULT_METRICS_ENDED_KEPT_S, gt=0, description="How long an ended run's gauges stay exported."
    )
    history: bool = Field(default=bool(DEFAULT_HISTORY))
    history_save_interval_s: float = Field(default=DEFAULT_HISTORY_SAVE_INTERVAL_S, gt=0)
    ended_run_kept_s: float = Field(
        default=DEFAULT_ENDED_RUN_KEPT_S, gt=0, description="How long what is kept per run outlives the run."
    )
    post_window_slowdown: float = Field(default=DEFAULT_POST_WINDOW_SLOWDOWN, gt=1)
    post_window_steps: int = Field(default=DEFAULT_POST_WINDOW_STEPS, ge=1)

