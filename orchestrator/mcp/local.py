"""The MCP tools on traces on this machine: ``analyze_traces`` and ``diff_traces`` (stdio only).

An agent is often handed a trace someone took with torch.profiler alone (a notebook, a
single-GPU script, a colleague's folder) or a profile `rayprof download` fetched. These
two give it the analysis `rayprof analyze` and `rayprof diff` give a person, with no
cluster and no service. Only the stdio server has them: there the agent and the server
are one user on one machine, while the HTTP service's route would let any caller with a
token read the service host's files. They write nothing (no report, no merged trace):
an agent's read leaves the folder as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from orchestrator.analysis.diff import diff_profiles
from orchestrator.analysis.diff_inputs import load_folder, read_local
from orchestrator.errors import InvalidRequestError
from orchestrator.mcp import convert
from orchestrator.mcp.bounds import answer
from orchestrator.mcp.results import Analysis, DiffResult
from orchestrator.mcp.tool_errors import tool_errors

__all__ = ["LOCAL_TOOLS", "add_local_tools"]

LOCAL_TOOLS = ("analyze_traces", "diff_traces")
"""Tools that read this machine's files: on the stdio server only."""

LocalPath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=4096,
        description="A folder of torch.profiler traces (*.pt.trace.json or .json.gz, one per rank; a profile "
        "`rayprof download` fetched) or one trace file, on the machine `rayprof mcp` runs on. ~ is expanded; a "
        "relative path is from the server's working folder.",
    ),
]


def _existing(text: str) -> Path:
    """``text`` as a path that exists here; refused with what to do where it does not (or is no path at all)."""
    path = Path(text).expanduser()
    try:
        found = path.exists()
    except (OSError, ValueError) as e:  # a NUL byte, a name too long for the file system
        raise InvalidRequestError(f"{text!r} is not a usable path ({e})") from None
    if not found:
        raise InvalidRequestError(
            f"{text}: no such file or folder on the machine `rayprof mcp` runs on (relative paths are from "
            f"{Path.cwd()}); for a stored profile use get_findings with its id"
        )
    return path


def add_local_tools(server: MCPServer) -> None:
    """Register the tools that read traces from this machine's files."""

    def analyze_traces(path: LocalPath) -> Annotated[CallToolResult, Analysis]:
        """Analyses torch.profiler traces on this machine, taken by rayprof or not (no cluster needed):
        findings with their savings (evidence and the concrete fix), stragglers, per-rank step time and
        device idle by cause. Writes nothing; `profile_id` in the answer is the path read."""
        with tool_errors():
            summary, manifest = read_local(_existing(path), path)
            return answer(convert.summary_analysis(summary, path, manifest))

    def diff_traces(
        before: Annotated[LocalPath, Field(description="The traces before the change (the baseline): a folder or a trace file here.")],
        after: Annotated[LocalPath, Field(description="The traces after the change: a folder or a trace file here.")],
    ) -> Annotated[CallToolResult, DiffResult]:
        """What changed from one folder of traces on this machine to another: step time, phases, ranks,
        ops and kernels, each with a Mann-Whitney significance verdict; findings resolved and new. For two
        stored profiles use diff."""
        with tool_errors():
            a, b = _existing(before), _existing(after)
            return answer(convert.diff_result(diff_profiles(load_folder(a, label=before), load_folder(b, label=after))))

    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    for fn in (analyze_traces, diff_traces):
        server.add_tool(fn, annotations=reads, structured_output=True)
