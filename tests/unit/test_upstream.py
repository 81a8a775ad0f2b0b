"""The agent side's one typed RPC: the controller and the relay serve the calls ``actors.upstream`` names,
with the same arguments and answers, and the remote wrappers send exactly those calls."""

from __future__ import annotations

import inspect
import re
from typing import Any, get_type_hints

import pytest
from ray import ObjectRef

from actors.controller.agents.agent_side import AgentSide
from actors.relay.core import RelayCore
from actors.relay.relay_actor import Relay
from actors.upstream import AgentUpstream, AgentUpstreamRpc, RelayUpstream, RelayUpstreamRpc
from tests.support.common import REPO

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _calls(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items() if inspect.iscoroutinefunction(value))


def _hints(fn: Any) -> dict[str, Any]:
    return get_type_hints(fn, localns={"ObjectRef": ObjectRef})


def _accepts(wanted: Any, served: Any) -> list[str]:
    """Where ``served`` cannot stand for ``wanted``: every call ``wanted`` allows must bind the same way."""
    want, have = inspect.signature(wanted), inspect.signature(served)
    want_hints, have_hints = _hints(wanted), _hints(served)
    have_params = list(have.parameters.values())
    problems = []
    for i, param in enumerate(want.parameters.values()):
        if param.name == "self":
            continue
        other = have.parameters.get(param.name)
        if other is None:
            problems.append(f"no parameter {param.name}")
            continue
        if param.kind in _POSITIONAL and (other.kind not in _POSITIONAL or have_params.index(other) != i):
            problems.append(f"{param.name} is not positional at {i}")
        if param.kind == inspect.Parameter.KEYWORD_ONLY and other.kind == inspect.Parameter.POSITIONAL_ONLY:
            problems.append(f"{param.name} cannot be given by keyword")
        if other.default != param.default:
            problems.append(f"{param.name} defaults to {other.default!r}, not {param.default!r}")
        if have_hints.get(param.name) != want_hints.get(param.name):
            problems.append(f"{param.name} is {have_hints.get(param.name)}, not {want_hints.get(param.name)}")
    extra = [p.name for p in have_params if p.name not in want.parameters and p.default is inspect.Parameter.empty]
    problems += [f"{name} is required but not in the protocol" for name in extra]
    return problems


@pytest.mark.parametrize(
    ("protocol", "server"),
    [(RelayUpstream, AgentSide), (AgentUpstream, AgentSide), (AgentUpstream, RelayCore), (AgentUpstream, Relay)],
    ids=["controller-for-relays", "controller-for-agents", "relay-core", "relay-actor"],
)
def test_the_controller_and_the_relay_serve_every_upstream_call_as_the_protocol_has_it(protocol, server):
    for name in sorted({*_calls(protocol), *_calls(AgentUpstream)}):
        wanted, served = getattr(protocol, name), getattr(server, name)
        assert inspect.iscoroutinefunction(served), f"{server.__name__}.{name} is not async"
        assert _hints(served)["return"] == _hints(wanted)["return"], f"{server.__name__}.{name} answers otherwise"
        assert _accepts(wanted, served) == [], f"{server.__name__}.{name}"


@pytest.mark.parametrize(("protocol", "rpc"), [(AgentUpstream, AgentUpstreamRpc), (RelayUpstream, RelayUpstreamRpc)])
def test_the_remote_wrappers_send_each_call_of_their_protocol_and_answer_its_result(protocol, rpc):
    calls = sorted({*_calls(protocol), *_calls(AgentUpstream)})
    assert sorted(n for n in vars(rpc) | vars(AgentUpstreamRpc) if not n.startswith("_")) == calls
    for name in calls:
        wanted, sends = getattr(protocol, name), getattr(rpc, name)
        answer = _hints(wanted)["return"]
        assert _hints(sends)["return"] == ObjectRef[None if answer is type(None) else answer], f"{rpc.__name__}.{name}"
        assert list(inspect.signature(sends).parameters.values()) == list(inspect.signature(wanted).parameters.values())


# A call through a handle (``handle.poll.remote(``, ``send.remote(``, ``getattr(h, m).remote(``); not
# ``ray.remote(Relay)`` nor the ``.remote(...)`` that starts the actor it makes, on a line of its own.
_REMOTE_CALL = re.compile(r"(?<!\bray)(?<=[\w)])\.remote\(")


def test_no_remote_method_is_named_by_a_string_in_the_agent_or_the_relay():
    # Every call upstream goes through actors.upstream's typed wrappers.
    found = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for package in ("actors/agent", "actors/relay")
        for path in sorted((REPO / package).rglob("*.py"))
        for line in path.read_text().splitlines()
        if _REMOTE_CALL.search(line)
    ]
    assert found == []


class _RecordingHandle:
    """An actor handle's surface: ``handle.<method>.remote(...)``, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        handle = self

        class _Method:
            def remote(self, *args: Any, **kwargs: Any) -> None:
                handle.sent.append((method, args, kwargs))

        return _Method()


def _sample_call(fn: Any) -> dict[str, Any]:
    """One object per parameter of ``fn`` (after self), by name."""
    return {name: object() for name in list(inspect.signature(fn).parameters)[1:]}


@pytest.mark.parametrize(("protocol", "rpc"), [(AgentUpstream, AgentUpstreamRpc), (RelayUpstream, RelayUpstreamRpc)])
def test_every_upstream_call_goes_by_keyword_with_the_protocols_names(protocol, rpc):
    # Workers and relays that imported the controller's module before an upgrade check a call against the
    # (**kwargs) Ray gives each method of the changed class: an argument by position never reaches it.
    handle = _RecordingHandle()
    for name in sorted({*_calls(protocol), *_calls(AgentUpstream)}):
        arguments = _sample_call(getattr(protocol, name))
        getattr(rpc(handle), name)(**arguments)
        method, args, kwargs = handle.sent[-1]
        assert (method, args, kwargs) == (name, (), arguments)


def test_every_client_operation_goes_to_the_controller_by_keyword():
    from actors.controller.rpc import ControllerRpc
    from orchestrator.models.api import OPERATIONS, ProfilingApi

    handle = _RecordingHandle()
    for name in OPERATIONS:
        op = getattr(ProfilingApi, name)
        required = {
            n: object() for n, p in list(inspect.signature(op).parameters.items())[1:] if p.default is inspect.Parameter.empty
        }
        ControllerRpc(handle).remote(op, **required)
        method, args, kwargs = handle.sent[-1]
        assert (method, args) == (name, ()) and required.items() <= kwargs.items()
