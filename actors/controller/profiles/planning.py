"""The controller's decisions, as pure functions: the actor gathers facts, these decide, the actor acts.

Nothing here awaits, reads a clock or touches storage, so every rule is
unit-tested with plain values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime

from actors.controller.profiles.state import Profile, Window
from orchestrator.errors import InvalidRequestError, TargetNotFoundError
from orchestrator.models.control import ControllerConfig, known_targets
from orchestrator.models.profile import RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState, TorchOptions
from orchestrator.settings import MIN_LEAD_STEPS

__all__ = [
    "ARM_COST_PER_SYNC",
    "ARM_COST_PER_SYNC_RELAYED",
    "ARM_ROUND_MARGIN",
    "arm_round_s",
    "CAP_MARGIN",
    "MAX_REARMS",
    "outcome",
    "rearm_after_missed_start",
    "plan_window",
    "selected_ranks",
    "start_step",
    "timeout_s",
    "trace_bytes_per_step",
    "validate",
]

# Arming grows with the number of ranks like the sync round does. With every
# rank calling the controller it was measured at ~2-4x the round (1,024 ranks:
# sync 0.96 s, all armed 3.8 s; loaded: sync 1.8 s, all armed 5.3 s); through
# relays one node round trip carries it: 1,024 ranks: sync 0.5 s, armed +0.5 s.
ARM_COST_PER_SYNC = 4.0
ARM_COST_PER_SYNC_RELAYED = 2.0
# The last window's own arm round (schedule -> the arm reached the last rank, by the ranks'
# clocks: hearing their ARMED takes a relay batch more) on the target, with this margin,
# bounds the lead from below: a cluster slower to arm than its sync round suggests is remembered.
ARM_ROUND_MARGIN = 1.5
# Plan shortened windows this far under the byte cap: step sizes vary a little.
CAP_MARGIN = 0.9
# A window whose arm came too late on every rank is armed again this many times,
# with the lead grown to the arm round just seen, before the profile ends FAILED.
MAX_REARMS = 1


def timeout_s(request: ProfileRequest, config: ControllerConfig) -> float:
    """How long a request may take: its own timeout, else the server default."""
    return request.timeout_s or config.request_timeout_s


def validate(request: ProfileRequest, config: ControllerConfig, world_size: int | None, known: Sequence[str]) -> None:
    """Refuse a request over a limit or aimed at ranks that do not exist.

    ``world_size`` is that of the live target (``None``: no live run of that name).
    """
    if request.steps > config.max_steps:
        raise InvalidRequestError(f"steps={request.steps} is over the maximum of {config.max_steps} (RAYPROF_MAX_STEPS)")
    if request.warmup > config.max_warmup_steps:
        raise InvalidRequestError(
            f"warmup={request.warmup} is over the maximum of {config.max_warmup_steps} (RAYPROF_MAX_WARMUP_STEPS)"
        )
    if request.timeout_s is not None and request.timeout_s > config.max_request_timeout_s:
        raise InvalidRequestError(f"timeout_s={request.timeout_s} is over the maximum of {config.max_request_timeout_s}")
    if world_size is None:
        raise TargetNotFoundError(
            f"no live training run named {request.target!r}; known targets: {known_targets(list(known))}",
            target=request.target,
        )
    if request.ranks is not None:
        bad = sorted(r for r in set(request.ranks) if r >= world_size)
        if bad:
            raise InvalidRequestError(
                f"ranks {bad} do not exist in {request.target!r} (world size {world_size})", target=request.target
            )
        if len(set(request.ranks)) != len(request.ranks):
            raise InvalidRequestError("ranks lists a rank twice", target=request.target)


def selected_ranks(request: ProfileRequest, world_size: int) -> list[int]:
    """The ranks a request covers, in order."""
    return sorted(request.ranks) if request.ranks is not None else list(range(world_size))


def start_step(
    ahead: float,
    step_times: Iterable[float],
    sync_round_s: float,
    arm_lead_s: float,
    warmup: int,
    relayed: bool = False,
    last_arm_round_s: float | None = None,
) -> int:
    """The first step of the window: ahead of the fastest rank by the time arming takes.

    ``ahead`` is the fastest rank's estimated step now; the lead is the longest
    of ``arm_lead_s``, ``ARM_COST_PER_SYNC x sync_round_s`` of training time
    (``ARM_COST_PER_SYNC_RELAYED`` when every rank polls through a relay) and
    ``ARM_ROUND_MARGIN x`` the target's last arm round, never fewer than
    ``MIN_LEAD_STEPS``; warmup steps come before the window. ``arm_lead_s`` is a
    floor, not an addition: each of the other two already holds its own margin.
    """
    lead = MIN_LEAD_STEPS
    times = [t for t in step_times if t]
    if times:
        per_sync = ARM_COST_PER_SYNC_RELAYED if relayed else ARM_COST_PER_SYNC
        arming = max(arm_lead_s, per_sync * sync_round_s, ARM_ROUND_MARGIN * (last_arm_round_s or 0.0))
        lead = max(lead, math.ceil(arming / min(times)))
    return math.floor(ahead) + lead + warmup


def arm_round_s(ranks: Iterable[RankResult], scheduled_at: datetime | None) -> float | None:
    """How long a window's arm took to reach every rank that acknowledged it (``armed_at``: the rank's time)."""
    armed = [r.armed_at for r in ranks if r.armed_at is not None]
    if scheduled_at is None or not armed:
        return None
    return max(0.0, (max(armed) - scheduled_at).total_seconds())


def plan_window(request: ProfileRequest, start: int, per_step_bytes: float | None, cap: int) -> Window:
    """The window's length: as asked, or shorter when the last like window showed it would pass the byte cap.

    Stopping early is cheaper than cutting at export: the profiler holds
    every event in memory until the window ends.
    """
    if per_step_bytes is None or per_step_bytes * request.steps <= cap:
        return Window(start, request.steps)
    steps = max(1, min(request.steps, math.floor(CAP_MARGIN * cap / per_step_bytes)))
    note = (
        f"window shortened from {request.steps} to {steps} steps: the last window on {request.target!r} with "
        f"these options wrote up to {per_step_bytes:,.0f} trace bytes per step on one rank, and the cap is "
        f"{cap:,} bytes (RAYPROF_MAX_TRACE_BYTES)"
    )
    return Window(start, steps, note)


def trace_bytes_per_step(request: ProfileRequest, profiles: Iterable[Profile]) -> float | None:
    """Largest raw trace bytes per step on any rank, in the latest finished window like ``request``."""
    options: TorchOptions = request.torch_options()
    # (when it ended, its window, its ranks): the filter's facts kept in the type, not asserted again.
    like = [
        (p.finished_at, p.window, p.ranks.values())
        for p in profiles
        if isinstance(p, Profile)
        and p.target == request.target
        and p.state.is_terminal
        and p.window is not None
        and p.finished_at is not None
        and p.request.torch_options() == options
        and any(r.trace_bytes for r in p.ranks.values())
    ]
    if not like:
        return None
    _, window, ranks = max(like, key=lambda ended: ended[0])
    return max(r.trace_bytes / window.steps for r in ranks if r.trace_bytes)


def rearm_after_missed_start(ranks: Iterable[RankResult], rearms: int, cancelled: bool) -> bool:
    """Whether to arm the window again: every rank missed its start, so none holds a
    window or a trace, and the arms that did arrive measured how long arming takes."""
    missed = [r.missed_start for r in ranks]
    return bool(missed) and all(missed) and not cancelled and rearms < MAX_REARMS


def outcome(
    ranks: Sequence[RankResult], window: Window | None, cancelled: bool
) -> tuple[ProfileState, str | None]:
    """The terminal state of a profile whose ranks have all ended, and why."""
    if cancelled:
        return ProfileState.CANCELLED, "cancelled by request"
    done = [r for r in ranks if r.state == RankState.DONE]
    stop = window.stop_step if window else 0
    cut = sorted(r.rank for r in done if r.last_step is not None and r.last_step + 1 < stop)
    shortened = window is not None and window.note is not None
    if done and len(done) == len(ranks) and not cut and not shortened:
        return ProfileState.DONE, None
    if done:
        failed = sorted(r.rank for r in ranks if r.state != RankState.DONE)
        notes = [f"ranks {failed} did not complete"] if failed else []
        notes += [f"ranks {cut} cut their trace at the byte cap (see their reasons)"] if cut else []
        notes += [window.note] if shortened and window is not None and window.note else []
        return ProfileState.PARTIAL, "; ".join(notes)
    reasons = sorted({r.reason or r.state.value for r in ranks})
    return ProfileState.FAILED, ("; ".join(reasons)[:500] if reasons else "no ranks selected")
