"""What the analysis concludes across ranks: how far their steps lie apart, process groups slower than their
peers, and the findings with their fixes (re-exported by :mod:`orchestrator.models.analysis`, whose ``Summary``
holds them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Finding", "SlowGroup", "StepSpread"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlowGroup(_Model):
    """A process group whose collectives take longer than those of its peers on every member: a slow link inside it."""

    name: str
    description: str
    ranks: list[int] = Field(description="Its members (every one of them analysed).")
    hosts: list[str] = Field(default_factory=list, description="The members' hosts, where the traces name them.")
    transfer_ms: float = Field(description="Median per step of its least-waiting member's collective time in it.")
    peer_transfer_ms: float = Field(description="The same for the typical peer group (the low median).")
    peers: int = Field(description="Groups doing the same work (description, size, calls and elements per step), itself included.")
    excess_ms: float


class StepSpread(_Model):
    """How far ranks' step times lie apart, and who holds whom back.

    In lockstep training the ranks that arrive early wait for the late ones, so
    the longest *step* belongs to a waiter. ``slowest_rank`` is instead the rank
    whose own work ends last (arrival lag plus busy time, i.e. step time minus
    waiting), the one the others wait for.
    """

    min_ms: float
    median_ms: float
    max_ms: float
    spread: float = Field(description="(max - min) / median of the per-rank median step times.")
    slowest_rank: int = Field(description="The rank whose work ends last: late start plus busy time.")
    fastest_rank: int = Field(description="The rank whose work ends first.")
    arrival_spread_ms: float = Field(default=0.0, description="Median over steps of latest minus earliest step start.")
    late_ranks: list[int] = Field(default_factory=list, description="Ranks that start their steps late.")
    waiting_ranks: list[int] = Field(default_factory=list, description="Ranks that wait for others (sync, collectives).")


class Finding(_Model):
    """A plain-language finding with its evidence and a concrete fix."""

    code: Literal[
        "dataloader_bound", "host_sync", "htod_copy", "low_gpu_utilization", "gpu_bound", "comm_exposed", "straggler", "memory_peak",
        "optimizer_host", "slow_link", "imbalance", "loader_restart", "train_report", "host_python",
        "accumulation_sync", "gc_pause", "cores_shared", "anomaly_mode", "activation_recompute", "param_loop", "generation",
        "rollout", "evaluation", "compile",
    ]
    severity: Literal["warning", "info"]
    max_saving_ms: float = Field(
        default=0.0, description="Step time its fix could save at most, per step (at least, where saving_floor)."
    )
    max_saving_fraction: float = Field(default=0.0, description="max_saving_ms over the step time.")
    saving_floor: bool = Field(
        default=False,
        description="max_saving_ms is what the fix saves at least: the trace shows only part of what it removes "
        "(anomaly detection's tracebacks run inside forward's ops).",
    )
    title: str
    evidence: str
    fix: str
    ranks: list[int]
