"""``rayprof mcp``: the MCP server over the client the CLI uses, on stdio.

:func:`build_server` is shared with the HTTP service's mount
(:mod:`orchestrator.mcp.http`); only where the client comes from differs.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

from mcp.server.mcpserver import MCPServer

from orchestrator.client import ProfilingClient
from orchestrator.mcp.local import add_local_tools
from orchestrator.mcp.prompts import add_prompts
from orchestrator.mcp.resources import add_resources
from orchestrator.mcp.tools import ClientSource, add_tools

__all__ = ["INSTRUCTIONS", "build_server", "lazy_client", "serve_stdio"]

INSTRUCTIONS = """\
rayprof profiles live PyTorch training runs on Ray. To find why a run is slow: list_targets (stalled \
and lagging runs first), history for when it slowed and which rank, profile a few steps (findings with \
their savings, stragglers, idle attribution per rank), and diff against an earlier profile to see what \
changed and whether it is noise. A STALLED run: take_stacks names the rank that is elsewhere and the \
collective others wait in. Answers are capped; `truncated` says what was cut.\
"""
LOCAL_INSTRUCTIONS = """ \
Traces already on this machine (torch.profiler's own, or a downloaded profile): analyze_traces gives the same \
findings with no cluster, diff_traces compares two folders.\
"""


def lazy_client(make: Callable[[], ProfilingClient]) -> ClientSource:
    """``make()`` on the first tool call, once: the server starts (and lists its tools) with no
    cluster or service reachable, and a connection error is a tool error an agent can read."""
    lock = threading.Lock()
    made: list[ProfilingClient] = []

    def source() -> ProfilingClient:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return source


def build_server(client: ClientSource, *, read_only: bool = False, version: str = "", local_files: bool = False) -> MCPServer:
    """The MCP server: tools (the acting ones unless ``read_only``; those that read this machine's traces where
    ``local_files``: the stdio server's), resources and prompts over ``client``.

    Leaves the process's logging as it found it: the SDK's constructor gives a root logger with no
    handler a ``rich`` one (``mcp.server.mcpserver.utilities.logging.configure_logging``), whose boxed,
    narrow tracebacks would be every log line of the process (a Serve replica's included). Undone here;
    the process's entry point chooses (:func:`serve_stdio`; Ray's in a replica)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    instructions = INSTRUCTIONS + (LOCAL_INSTRUCTIONS if local_files else "")
    server = MCPServer("rayprof", instructions=instructions, version=version, log_level="WARNING")
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    add_tools(server, client, read_only=read_only)
    if local_files:
        add_local_tools(server)
    add_resources(server, client)
    add_prompts(server, read_only=read_only)
    return server


def serve_stdio(client: ClientSource, *, read_only: bool = False, version: str = "") -> None:
    """Serve MCP on stdin/stdout until the client closes them (the SDK points fd 1 at stderr meanwhile).

    Logs warnings and errors to stderr, which the agent's MCP client shows, as plain records: a line
    with the level, logger and message, then the traceback as Python prints it (a tool's unexpected
    error, and a server fault whose message the tool error hides)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    build_server(client, read_only=read_only, version=version, local_files=True).run("stdio")
