"""The MCP tools: each one client call (or two), its answer converted and capped.

Tools that act on the live job (start a window, take every rank's stacks, add or
remove a watch) say so in their description and annotations, and are left out of
a read-only server. Tools are plain functions: the SDK runs them in a worker
thread, so the client's blocking calls never stall the server's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

import anyio.from_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from orchestrator.client import ProfileHandle, ProfilingClient
from orchestrator.errors import InvalidRequestError, ProfileTimeoutError
from orchestrator.mcp import convert
from orchestrator.mcp.bounds import answer
from orchestrator.mcp.results import (
    Analysis,
    DiffResult,
    HistoryResult,
    ProfileList,
    ProfileResult,
    StacksResult,
    TargetList,
    WatchCreated,
    WatchList,
)
from orchestrator.mcp.tool_errors import tool_errors
from orchestrator.models.common import Name
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.profile import ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.settings import MAX_HISTORY_SPAN_S

__all__ = ["ACTING_TOOLS", "ClientSource", "add_tools"]

logger = logging.getLogger(__name__)

ClientSource = Callable[[], ProfilingClient]

MAX_WAIT_S = 900.0
"""The longest a tool call waits for a window: an agent's call should not hang for longer."""
MAX_LIST = 50
HISTORY_RANKS = 16
"""Ranks a history answer lists at most (the slowest, as the server picks them): more would not fit the cap."""
ACTING_TOOLS = ("profile", "take_stacks", "create_watch", "delete_watch")
"""Tools that change the live job or what is stored; ``--read-only`` leaves them out."""

_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)

ProfileId = Annotated[Name, Field(description="A profile or stacks bundle id (list_profiles shows them).")]
Target = Annotated[Name, Field(description="The run's name (list_targets shows the live ones).")]
WaitS = Annotated[float, Field(gt=0, le=MAX_WAIT_S, description="How long to wait for the end, seconds.")]


def add_tools(server: MCPServer, client: ClientSource, *, read_only: bool) -> None:
    """Register the tools on ``server``; the acting ones only when not ``read_only``."""

    def list_targets() -> Annotated[CallToolResult, TargetList]:
        """Live training runs: ranks, each rank's step and step time, health (STALLED), lagging ranks,
        the window running now. Start here: stalled and lagging runs are listed first."""
        with tool_errors():
            return answer(convert.target_list(client().targets()))

    def get_profile(
        profile_id: ProfileId, ctx: Context, wait: bool = False, wait_timeout_s: WaitS = 300.0
    ) -> Annotated[CallToolResult, ProfileResult]:
        """A profile's (or stacks bundle's) state, each rank's outcome and, once it ended, its
        analysis: findings with their savings, stragglers, per-rank time and idle attribution."""
        with tool_errors():
            handle = client().get(profile_id)
            return answer(_ended(handle, wait, wait_timeout_s, ctx))

    def get_findings(profile_id: ProfileId) -> Annotated[CallToolResult, Analysis]:
        """The analysis of an ended profile: findings (largest saving first, with evidence and fix),
        stragglers and the phase that holds them back, per-rank step time and device idle by cause."""
        with tool_errors():
            handle = client().get(profile_id)
            status = handle.status()
            if not status.state.is_terminal:
                raise ProfileTimeoutError(f"profile {profile_id} is still {status.state.value}", profile_id=profile_id)
            analysis = convert.analysis_of(handle.manifest())
            if analysis is None:
                raise InvalidRequestError(
                    f"{profile_id} has no analysis: a {status.kind} bundle ended {status.state.value} "
                    f"({status.reason or 'no reason given'}); get_profile shows it", profile_id=profile_id
                )
            return answer(analysis)

    def list_profiles(
        target: Target | None = None,
        state: ProfileState | None = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LIST)] = 20,
    ) -> Annotated[CallToolResult, ProfileList]:
        """Stored profiles and stacks bundles, newest first (ids for get_profile, get_findings, diff)."""
        with tool_errors():
            return answer(convert.profile_list(client().list(target, state, limit=limit)))

    def diff(
        a: Annotated[Name, Field(description="The profile before (the baseline).")],
        b: Annotated[Name, Field(description="The profile after.")],
    ) -> Annotated[CallToolResult, DiffResult]:
        """What changed from profile a to profile b: step time, phases, ranks, ops and kernels, each with a
        Mann-Whitney significance verdict; findings resolved and new. Compare profiles of the same target."""
        with tool_errors():
            return answer(convert.diff_result(client().diff(a, b)))

    def history(
        target: Target,
        run: Annotated[str | None, Field(max_length=128, description="The run's Ray job, when two share a name.")] = None,
        span_s: Annotated[float, Field(gt=0, le=MAX_HISTORY_SPAN_S, description="How far back, seconds.")] = 600.0,
        ranks: Annotated[list[Annotated[int, Field(ge=0)]] | None, Field(description="Only these ranks.")] = None,
        max_points: Annotated[int, Field(ge=2, le=240, description="Points per rank at most.")] = 60,
    ) -> Annotated[CallToolResult, HistoryResult]:
        """Step time per rank over time (slowest median first), downsampled: when it slowed and which rank.
        Of many ranks the slowest are listed (`ranks_total` says how many had points)."""
        with tool_errors():
            # The server's budget is every rank's points together: enough for HISTORY_RANKS ranks at max_points.
            points = client().history(target, run=run, span_s=span_s, ranks=ranks, max_points=max_points * HISTORY_RANKS)
            return answer(convert.history_result(points, max_points))

    def list_watches() -> Annotated[CallToolResult, WatchList]:
        """Every watch: its condition, state, what it observes now, and its last firings."""
        with tool_errors():
            return answer(convert.watch_list(client().watches()))

    for fn in (list_targets, get_profile, get_findings, list_profiles, diff, history, list_watches):
        server.add_tool(fn, annotations=_READ, structured_output=True)
    if read_only:
        return

    def profile(
        request: ProfileRequest,
        ctx: Context,
        wait: Annotated[bool, Field(description="Wait for the end and answer with the findings.")] = True,
        wait_timeout_s: WaitS = 300.0,
    ) -> Annotated[CallToolResult, ProfileResult]:
        """ACTS on the live job: records `request.steps` optimizer steps with torch.profiler on every rank
        (or `request.ranks`), then analyses them. With wait (default) answers with the findings and their
        savings, stragglers, per-rank idle attribution and the manifest's location; else with the id to poll.
        One window per target at a time: set request.queue=true to run after a running one."""
        with tool_errors():
            handle = client().profile(**request.model_dump(exclude_defaults=True))
            return answer(_ended(handle, wait, wait_timeout_s, ctx))

    def take_stacks(
        target: Target,
        run: Annotated[str | None, Field(max_length=128, description="The run's Ray job, when two share a name.")] = None,
    ) -> Annotated[CallToolResult, StacksResult]:
        """ACTS on the live job: takes every live rank's Python stacks now (a few seconds, training goes on)
        and stores them as a bundle. Answers grouped stacks, ranks unlike the majority first, and the verdict
        on a hang: which rank is where, and which collective some ranks never joined."""
        with tool_errors():
            bundle = client().stacks(target, run=run)
            health = next((t for t in client().targets() if t.name == target), None)
            return answer(convert.stacks_result(bundle, health))

    def create_watch(watch: WatchSpec) -> Annotated[CallToolResult, WatchCreated]:
        """ACTS on the live job: watches a target and, while the condition holds, takes a profile or
        stacks on its own (slower_than a baseline, rank_lag, stalled, or every_s on a schedule)."""
        with tool_errors():
            created = client().watch(**watch.model_dump(exclude_defaults=True))
            return answer(WatchCreated(watch=convert.watch_brief(created)))

    def delete_watch(watch_id: Annotated[Name, Field(description="The watch's id (list_watches).")]) -> Annotated[CallToolResult, WatchList]:
        """ACTS on the controller: stops and forgets a watch (its firings' profiles stay). Answers the watches left."""
        with tool_errors():
            c = client()
            c.delete_watch(watch_id)
            return answer(convert.watch_list(c.watches()))

    acts = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    server.add_tool(profile, annotations=acts, structured_output=True)
    server.add_tool(take_stacks, annotations=acts, structured_output=True)
    server.add_tool(create_watch, annotations=acts, structured_output=True)
    removes = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)
    server.add_tool(delete_watch, annotations=removes, structured_output=True)


def _progress(ctx: Context) -> Callable[[ProfileStatus], None]:
    """Each status a wait sees as a progress notice (when the caller asked for them): the state and
    every rank's, numbered 1, 2, ... as the protocol wants progress to grow."""
    sent = 0

    def report(status: ProfileStatus) -> None:
        nonlocal sent
        sent += 1
        ranks = ", ".join(f"rank {r.rank} {r.state.value}" for r in status.ranks[:16])
        try:
            anyio.from_thread.run(ctx.report_progress, sent, None, f"{status.state.value}: {ranks}")
        except Exception:  # noqa: BLE001 - a notice a transport cannot carry must not fail the wait
            logger.debug("progress notice not sent", exc_info=True)

    return report


def _ended(handle: ProfileHandle, wait: bool, wait_timeout_s: float, ctx: Context) -> ProfileResult:
    """The handle's result now, or (``wait``) at its end; a window still running at the timeout is
    answered as it stands, with what to call next, not as an error."""
    manifest = None
    status = handle.last_status
    if wait and not status.state.is_terminal:
        try:
            manifest = handle.wait(timeout=wait_timeout_s, progress=_progress(ctx))
        except ProfileTimeoutError:
            pass
        status = handle.last_status
    elif status.state.is_terminal:
        manifest = handle.manifest()
    return convert.profile_result(status, manifest)

