"""The MCP prompts: plans over the server's own tools, driven through the SDK's client in process."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from orchestrator.mcp import build_server


def _never() -> Any:
    raise AssertionError("a prompt reached the client: prompts only plan tool calls")


async def _served(read_only: bool, name: str | None = None, args: dict[str, str] | None = None) -> dict[str, Any]:
    async with Client(build_server(_never, read_only=read_only)) as c:
        prompts = {p.name: p for p in (await c.list_prompts()).prompts}
        tools = {t.name for t in (await c.list_tools()).tools}
        text, error = None, None
        if name is not None:
            try:
                got = await c.get_prompt(name, args or {})
                text = "\n".join(m.content.text for m in got.messages)
            except MCPError as e:  # caught here: past the client's task group it is an exception group
                error = e.error
        return {"prompts": prompts, "tools": tools, "text": text, "error": error}


def _served_sync(read_only: bool, name: str | None = None, args: dict[str, str] | None = None) -> dict[str, Any]:
    return anyio.run(lambda: _served(read_only, name, args))


def _tools_named(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", text))


def test_an_acting_server_offers_why_slow_and_why_stuck_each_taking_the_run():
    prompts = _served_sync(False)["prompts"]

    assert set(prompts) == {"why_slow", "why_stuck"}
    for prompt in prompts.values():
        assert [(a.name, a.required) for a in prompt.arguments] == [("target", True)]


def test_a_read_only_server_has_no_why_stuck():
    assert set(_served_sync(True)["prompts"]) == {"why_slow"}


@pytest.mark.parametrize(("read_only", "name"), [(False, "why_slow"), (False, "why_stuck"), (True, "why_slow")])
def test_a_prompt_names_only_tools_the_server_has_and_names_the_run(read_only, name):
    served = _served_sync(read_only, name, {"target": "llm-pretrain"})

    named = _tools_named(served["text"])
    assert named and named <= served["tools"]
    assert "llm-pretrain" in served["text"]


def test_why_slow_starts_a_window_on_an_acting_server_and_reads_stored_profiles_on_a_read_only_one():
    acting = _served_sync(False, "why_slow", {"target": "r"})["text"]
    read_only = _served_sync(True, "why_slow", {"target": "r"})["text"]

    assert "profile" in _tools_named(acting) and "get_findings" not in _tools_named(acting)
    assert "profile" not in _tools_named(read_only) and "get_findings" in _tools_named(read_only)


def test_why_slow_says_to_stay_silent_when_nothing_is_at_warning_level():
    text = _served_sync(False, "why_slow", {"target": "r"})["text"]

    assert "nothing to fix" in text and "do not invent one" in text


@pytest.mark.parametrize("target", ["../etc", "a b", "", "x" * 300])
def test_a_run_name_the_api_would_refuse_is_refused_by_the_prompt_saying_why(target):
    refused = _served_sync(False, "why_slow", {"target": target})["error"]

    assert refused.code == INVALID_PARAMS
    assert "is not a run name" in refused.message and "list_targets" in refused.message


def test_why_stuck_tells_a_run_slow_in_an_evaluation_from_a_hung_one():
    text = _served_sync(False, "why_stuck", {"target": "r"})["text"]

    assert "evaluating, saving or loading a checkpoint, or compiling, the run is slow there, not hung" in text
