"""The MCP tools on traces on this machine (analyze_traces, diff_traces): stdio only, no cluster, nothing written.

Driven through the SDK's own client, in process and (once) over stdio as an agent's client starts `rayprof mcp`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, ClientSession, StdioServerParameters, stdio_client

from orchestrator.mcp import build_server
from orchestrator.mcp.local import LOCAL_TOOLS
from tests.support.common import RAYPROF_CLI
from tests.support.serve_fixtures import free_port
from tests.support.tracefiles import case, shared


def _no_client() -> Any:
    raise AssertionError("a local tool asked for the rayprof service")


def _call(tool: str, arguments: dict[str, Any], *, local_files: bool = True) -> Any:
    async def go() -> Any:
        async with Client(build_server(_no_client, local_files=local_files)) as c:
            return await c.call_tool(tool, arguments)

    return anyio.run(go)


def _error(result: Any) -> str:
    """A tool error's own text (the SDK puts "Error executing tool NAME: " before it)."""
    assert result.is_error
    return result.content[0].text.split(": ", 1)[1]


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_analyze_traces_gives_the_findings_of_a_trace_taken_without_rayprof(tmp_path):
    # The TensorBoard plugin's num_workers=0 ResNet50 sample: torch.profiler's own trace, no rayprof in it.
    folder = tmp_path / "nw0"
    shutil.copytree(shared("external-traces", "tbplugin_resnet50_nw0_a"), folder)
    before = _files(folder)
    result = _call("analyze_traces", {"path": str(folder)})
    assert not result.is_error
    answer = result.structured_content
    assert answer["profile_id"] == str(folder)
    assert answer["findings"][0]["code"] == "dataloader_bound"
    assert "num_workers" in answer["findings"][0]["fix"]
    assert answer["verdict"].startswith("1 warning; the largest: Data loading takes")
    assert _files(folder) == before  # no report, no merged trace: an agent's read changes nothing


def test_analyze_traces_reads_one_trace_file(tmp_path):
    trace = next(case("dataloader_bound").rglob("*.pt.trace.json.gz"))
    answer = _call("analyze_traces", {"path": str(trace)}).structured_content
    assert [r["rank"] for r in answer["ranks"]] == [0]
    assert answer["findings"][0]["code"] == "dataloader_bound"


def test_diff_traces_says_what_a_fix_changed_and_that_it_is_no_noise():
    result = _call("diff_traces", {"before": str(case("dataloader_bound")), "after": str(case("healthy"))})
    assert not result.is_error
    answer = result.structured_content
    assert answer["step_time"]["verdict"] == "decreased"
    assert any(c.startswith("phase data shrank") for c in answer["claims"])


def test_a_path_that_is_not_there_is_a_tool_error_that_names_it_and_the_other_way(tmp_path):
    text = _error(_call("analyze_traces", {"path": str(tmp_path / "gone")}))
    assert text.startswith(f"[invalid_request] {tmp_path / 'gone'}: no such file or folder")
    assert "get_findings with its id" in text


def test_a_folder_without_traces_is_a_tool_error_saying_what_was_there(tmp_path):
    (tmp_path / "notes.txt").write_text("not a trace")
    text = _error(_call("analyze_traces", {"path": str(tmp_path)}))
    assert text.startswith(f"[invalid_request] {tmp_path}: no analysable rank trace")
    assert "no *.pt.trace.json[.gz] files" in text


def test_the_http_services_server_has_no_tool_that_reads_its_hosts_files():
    async def names(local_files: bool) -> set[str]:
        async with Client(build_server(_no_client, local_files=local_files)) as c:
            return {t.name for t in (await c.list_tools()).tools}

    assert set(LOCAL_TOOLS) <= anyio.run(names, True)
    assert not set(LOCAL_TOOLS) & anyio.run(names, False)
    assert "Unknown tool" in _call("analyze_traces", {"path": "/"}, local_files=False).content[0].text


def test_the_local_tools_are_read_only():
    async def tools() -> list[Any]:
        async with Client(build_server(_no_client, local_files=True)) as c:
            return [t for t in (await c.list_tools()).tools if t.name in LOCAL_TOOLS]

    for tool in anyio.run(tools):
        assert tool.annotations is not None and tool.annotations.read_only_hint is True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=40))
def test_any_path_text_answers_findings_or_an_invalid_request_never_a_server_fault(tmp_path, name):
    result = _call("analyze_traces", {"path": f"{tmp_path}/{name}"})
    if result.is_error:
        assert _error(result).startswith("[invalid_request]"), result.content[0].text
    else:
        assert result.structured_content["ranks"]


def test_rayprof_mcp_over_stdio_analyzes_a_local_folder_with_no_service():
    # The console script as an agent's MCP client starts it, pointed at a service that is not there.
    params = StdioServerParameters(command=RAYPROF_CLI, args=["mcp", "--url", f"http://127.0.0.1:{free_port()}"])

    async def go() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return await s.call_tool("analyze_traces", {"path": str(case("dataloader_bound"))})

    result = anyio.run(go)
    assert not result.is_error
    assert result.structured_content["findings"][0]["code"] == "dataloader_bound"
