"""What the MCP server writes to its stderr, which is what an agent's MCP client shows of ``rayprof mcp``:
plain log records, never the SDK's rich boxes, and a failing tool's error in them. In child processes:
the SDK's logging setup only shows where nothing configured logging before (pytest does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.support.common import REPO

# A server whose every tool call fails unexpectedly: the SDK logs those with their traceback.
_FAILING_SERVER = """
from orchestrator.mcp import serve_stdio

def broken():
    raise RuntimeError("the client broke: 7f3a")

serve_stdio(broken)
"""

# Box-drawing characters rich frames its tracebacks with.
_RICH = set("╭╮╰╯│─┌┐└┘━┃")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_a_failing_tool_call_logs_a_plain_record_with_the_error(tmp_path: Path):
    params = StdioServerParameters(command=sys.executable, args=["-c", _FAILING_SERVER], env=_env(), cwd=str(REPO))
    log = tmp_path / "stderr.txt"

    async def go() -> bool:
        with log.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                return (await s.call_tool("list_targets", {})).is_error

    assert anyio.run(go) is True
    text = log.read_text()
    assert "RuntimeError: the client broke: 7f3a" in text, text
    assert not _RICH & set(text), text
    # One record per logged event, starting with its level and logger; the traceback follows it as Python prints it.
    (record,) = [line for line in text.splitlines() if "raised an unexpected exception" in line]
    assert record.startswith("ERROR mcp."), record
    assert "Traceback (most recent call last):" in text


def test_building_a_server_leaves_the_process_logging_as_it_was():
    # The service's replica builds one: the SDK would give the root logger a rich handler there too.
    probe = "import logging; from orchestrator.mcp import build_server; build_server(lambda: None); " \
        "r = logging.getLogger(); print([type(h).__name__ for h in r.handlers], r.level)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["[]", str(30)], done.stdout
