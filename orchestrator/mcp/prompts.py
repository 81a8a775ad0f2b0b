"""MCP prompts: the two questions rayprof answers, as a plan over its own tools.

A client shows a prompt as a command its user picks (Claude Code: ``/mcp__rayprof__why_slow``); the agent gets the
steps that answer the question from a fresh capture of the live run rather than from guesses. Each prompt names only
tools this server has: a read-only server reads the latest stored profile instead of starting a window, and has no
``why_stuck`` (its answer needs every rank's stacks, which only an acting server takes).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from pydantic import Field, TypeAdapter, ValidationError

from orchestrator.models.common import Name

__all__ = ["add_prompts"]

# A plain string to the SDK, checked here: a name the SDK refused would reach the client as "Internal server error".
Run = Annotated[str, Field(description="The run's name, as list_targets shows it.")]
_NAME = TypeAdapter(Name)

_ANSWER = (
    "Answer in a few lines: the first finding at warning level, what it costs per step and the change its fix names, "
    "with the evidence the finding gives. If no finding is at warning level, say the run has nothing to fix and do not "
    "invent one; info-level findings are context, not advice."
)


def why_slow_steps(target: str, *, read_only: bool) -> str:
    """The plan for "why is this run slow?" with the tools a server of this kind has."""
    if read_only:
        capture = (
            f"3. `list_profiles` for {target}; `get_findings` of the newest one that ended DONE or PARTIAL (this "
            "server is read-only and cannot start a window: if none is stored, say so)."
        )
        compare = "4. If an earlier one is stored, `diff` the two: what changed, and whether the change is beyond noise."
    else:
        capture = (
            f"3. `profile` with request {{target: {target}, steps: 5, queue: true}} and wait=true: the answer holds "
            "the findings with their savings, the stragglers and each rank's device idle by cause."
        )
        compare = (
            f"4. If `list_profiles` shows an earlier profile of {target} that ended DONE, `diff` it against the new one: "
            "what changed since, and whether the change is beyond noise."
        )
    return "\n".join([
        f"Find out why the training run {target} is slow, from rayprof's tools:",
        f"1. `list_targets`: {target}'s step time, whether it is STALLED (then ask why it is stuck), its lagging ranks.",
        f"2. `history` of {target}: when the step time changed, and which ranks were slowest.",
        capture,
        compare,
        _ANSWER,
    ])


def why_stuck_steps(target: str) -> str:
    """The plan for "why does this run not advance?"."""
    return "\n".join([
        f"Find out why the training run {target} makes no progress, from rayprof's tools:",
        f"1. `list_targets`: is {target} STALLED, since when, and at which step is each rank? A STALLED run's "
        "stall_verdict is what the stacks taken when it stalled showed.",
        f"2. `take_stacks` of {target}: every rank's Python stacks, grouped; its verdict names the rank that is "
        "somewhere else and the collective the others wait in, and each group's activity what its frames say it "
        "is doing.",
        "Answer in a few lines: which rank holds the others back, the file and line it is at, what the others wait "
        "in, and what to look at in that code. Where every rank is evaluating, saving or loading a checkpoint, or "
        "compiling, the run is slow there, not hung: say so, and that a larger RAYPROF_STALL_MIN_S stops calling such "
        "a phase a stall. If every rank is in the same place otherwise, say that no rank stands out.",
    ])


def _run_name(target: str) -> str:
    try:
        return _NAME.validate_python(target)
    except ValidationError as e:
        why = e.errors()[0]["msg"]
        raise MCPError(INVALID_PARAMS, f"target {target[:80]!r} is not a run name ({why}): list_targets shows them") from None


def add_prompts(server: MCPServer, *, read_only: bool) -> None:
    """Register the prompts on ``server``: ``why_stuck`` only where take_stacks is a tool."""

    @server.prompt(title="Why is this run slow?")
    def why_slow(target: Run) -> str:
        """Find why a live training run is slow and name the change that fixes it, from a capture of its own steps."""
        return why_slow_steps(_run_name(target), read_only=read_only)

    if not read_only:

        @server.prompt(title="Why is this run stuck?")
        def why_stuck(target: Run) -> str:
            """Find which rank holds a stalled training run back, and where, from every rank's stacks."""
            return why_stuck_steps(_run_name(target))
