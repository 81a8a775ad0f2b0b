"""The service's ``/mcp`` read-only mode: the real app in process (tests/support/inprocess_service.py),
spoken to in MCP's JSON-RPC over HTTP, and the app arg, env var and ``rayprof serve`` flag that set it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli.main import _parser
from orchestrator.config import mcp_read_only
from orchestrator.errors import ConfigurationError
from orchestrator.mcp.tools import ACTING_TOOLS
from orchestrator.service import app as service_app
from orchestrator.settings import (
    ALLOWED_HOSTS_ENV_VAR,
    MCP_READ_ONLY_ENV_VAR,
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
)
from tests.support.fake_agents import make_controller, run
from tests.support.inprocess_service import service_client

_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
_INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "t", "version": "0"},
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR, MCP_READ_ONLY_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


def _over_http(
    home: Any, monkeypatch: pytest.MonkeyPatch, call: str | None = None, **options: Any
) -> tuple[set[str], dict[str, Any]]:
    """The tool names ``/mcp`` lists and its answer to a call of the tool ``call``, over HTTP (a tool
    that ran would reach Ray through the service's client: only one it refuses is called here)."""

    async def go() -> tuple[set[str], dict[str, Any]]:
        async with service_client(monkeypatch, make_controller(home), **options) as http:

            async def rpc(n: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
                answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": n, "method": method, "params": params}, headers=_HEADERS)
                assert answer.status_code == 200, answer.text
                body: dict[str, Any] = answer.json()
                return body

            await rpc(1, "initialize", _INITIALIZE)
            tools = await rpc(2, "tools/list", {})
            called = await rpc(3, "tools/call", {"name": call, "arguments": {"target": "run"}}) if call else {}
            return {t["name"] for t in tools["result"]["tools"]}, called

    result: tuple[set[str], dict[str, Any]] = run(go())
    return result


def test_a_read_only_service_lists_no_acting_tool_and_refuses_to_call_one(home, monkeypatch):
    every, _ = _over_http(home, monkeypatch)
    assert set(ACTING_TOOLS) <= every

    listed, called = _over_http(home, monkeypatch, call="take_stacks", mcp_read_only=True)
    assert listed == every - set(ACTING_TOOLS)
    # An unknown tool: an error naming it, and nothing reached the controller (which would need Ray).
    assert called["result"]["isError"] is True
    assert "take_stacks" in called["result"]["content"][0]["text"]


def test_the_env_var_makes_the_service_read_only_when_the_arg_is_unset(home, monkeypatch):
    monkeypatch.setenv(MCP_READ_ONLY_ENV_VAR, "1")
    listed, _ = _over_http(home, monkeypatch)
    assert not listed & set(ACTING_TOOLS)
    listed, _ = _over_http(home, monkeypatch, mcp_read_only=False)  # the arg wins
    assert set(ACTING_TOOLS) <= listed


@pytest.mark.parametrize(
    ("value", "read_only"),
    [(True, True), (False, False), (1, True), (0, False), ("1", True), ("0", False), ("true", True), ("False", False)],
)
def test_the_arg_takes_a_bool_or_its_spellings(value, read_only):
    assert mcp_read_only(value) is read_only


@pytest.mark.parametrize(("raw", "read_only"), [("", False), ("0", False), ("1", True), ("TRUE", True)])
def test_the_env_var_is_read_when_the_arg_is_unset(monkeypatch, raw, read_only):
    monkeypatch.setenv(MCP_READ_ONLY_ENV_VAR, raw)
    assert mcp_read_only(None) is read_only


_FLAG_SPELLINGS = {"0", "1", "true", "false"}


@given(st.one_of(st.text(), st.integers(), st.floats(), st.lists(st.booleans())))
def test_anything_else_is_a_configuration_error_naming_the_arg(value):
    if isinstance(value, str | int) and str(value).strip().lower() in _FLAG_SPELLINGS:
        return
    with pytest.raises(ConfigurationError, match="mcp_read_only=.* is not a flag"):
        mcp_read_only(value)


def test_a_bad_env_var_fails_the_build_naming_the_variable(monkeypatch):
    monkeypatch.setattr(service_app, "serve_http_host", lambda: "127.0.0.1")
    monkeypatch.setenv(MCP_READ_ONLY_ENV_VAR, "yes please")
    with pytest.raises(ConfigurationError, match=f"{MCP_READ_ONLY_ENV_VAR}='yes please' is not a flag"):
        service_app.build_app({})


def test_build_app_passes_the_arg_or_the_env_var_to_the_deployment(monkeypatch):
    monkeypatch.setattr(service_app, "serve_http_host", lambda: "127.0.0.1")

    def built(args: dict[str, Any]) -> Any:
        return service_app.build_app(args)._bound_deployment.init_kwargs["mcp_read_only"]

    assert built({}) is False
    assert built({"mcp_read_only": "true"}) is True
    monkeypatch.setenv(MCP_READ_ONLY_ENV_VAR, "1")
    assert built({}) is True
    assert built({"mcp_read_only": None}) is True  # `rayprof serve` without the flag
    assert built({"mcp_read_only": False}) is False
    with pytest.raises(ConfigurationError, match="mcp_read_only='maybe'"):
        service_app.build_app({"mcp_read_only": "maybe"})


def test_rayprof_serve_passes_the_flag_only_when_given():
    assert _parser().parse_args(["serve", "--mcp-read-only"]).mcp_read_only is True
    assert _parser().parse_args(["serve"]).mcp_read_only is None
