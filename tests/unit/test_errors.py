"""Every rayprof error maps, once, to an HTTP status and JSON body, a CLI exit status, and back;
it crosses Ray as itself (:func:`actors.controller.rpc.ray_errors`) and the controller raises no other."""

from __future__ import annotations

import importlib
import json
import pickle
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from starlette.requests import Request

from actors.controller.rpc import is_unreachable, ray_errors
from orchestrator import errors
from orchestrator.cli.main import main
from orchestrator.client.http import error_for
from orchestrator.errors import EXIT_FAILED, EXIT_USAGE, ControllerUnavailableError, RayprofError, validation_problems
from orchestrator.models.requests import ProfileRequest
from orchestrator.service.api import ERROR_RESPONSES
from orchestrator.service.security import rayprof_error_response

ROOT = Path(__file__).resolve().parents[2]


def _tree(cls: type[RayprofError]) -> list[type[RayprofError]]:
    return [cls] + [found for sub in cls.__subclasses__() for found in _tree(sub)]


ALL = [cls for cls in _tree(RayprofError) if cls.__module__ == errors.__name__]


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/v1/x", "headers": [], "query_string": b""})


def test_the_tree_is_the_module_and_every_code_is_its_own():
    defined = {obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, RayprofError)}
    assert defined == set(ALL)
    codes = [cls.code for cls in ALL]
    assert len(codes) == len(set(codes)), codes


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
def test_every_error_maps_to_http_the_cli_and_back(cls, monkeypatch, capsys):
    error = cls("what went wrong", profile_id="prof-1", target="run")
    # In the tree the module's docstring draws.
    assert re.search(rf"^\s*(│\s*)*[├└]── {cls.__name__}\s", errors.__doc__, re.MULTILINE) or cls is RayprofError
    # HTTP: a status the API documents, and the JSON body {"error": code, "detail": ...}.
    assert cls.http_status in ERROR_RESPONSES, f"{cls.http_status} is not in the API's documented responses"
    response = rayprof_error_response(_request(), error)
    body = json.loads(response.body)
    assert response.status_code == cls.http_status
    # (a server fault's detail is a generic message with an error_id: the text stays in the log)
    assert body["error"] == cls.code and {"error", "detail"} <= set(body) <= {"error", "detail", "error_id"}
    # The HTTP client raises the same class from that answer.
    assert type(error_for(response.status_code, body["error"], body["detail"])) is cls
    # The CLI: 2 for what the caller can fix (4xx), 1 for the rest, with the code on stderr and in --json.
    assert error.exit_status == (EXIT_USAGE if 400 <= cls.http_status < 500 else EXIT_FAILED)
    from orchestrator.cli import commands

    cli = importlib.import_module("orchestrator.cli.main")  # the package exports its function ``main``

    def raises(args):
        raise cls("what went wrong")

    monkeypatch.setattr(commands, "targets", raises)
    assert cli.main(["targets", "--url", "http://127.0.0.1:1", "--json"]) == error.exit_status
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": cls.code, "detail": "what went wrong"}
    assert f"rayprof: {cls.code}: what went wrong" in err
    # Across Ray: pickled with its context, and re-raised as itself out of a task's error.
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and (copy.message, copy.profile_id, copy.target) == ("what went wrong", "prof-1", "run")
    with pytest.raises(cls) as raised, ray_errors():
        raise RayTaskError("get", "traceback", error)
    assert raised.value is error
    if isinstance(error, ControllerUnavailableError):
        assert not is_unreachable(raised.value)  # the controller said so: no retry, no new handle


@pytest.mark.parametrize("ray_error", [RayActorError(), GetTimeoutError("slow"), TimeoutError()], ids=type)
def test_a_controller_that_cannot_be_reached_is_unavailable(ray_error):
    with pytest.raises(ControllerUnavailableError) as raised, ray_errors():
        raise ray_error
    assert type(raised.value) is ControllerUnavailableError and is_unreachable(raised.value)
    assert raised.value.http_status == 503


def test_a_bug_in_the_controller_passes_through():
    bug = RayTaskError("get", "traceback", KeyError("x"))
    with pytest.raises(RayTaskError), ray_errors():
        raise bug


def test_the_controller_and_the_service_raise_only_errors_of_the_tree():
    """An error class the controller or service raises is in ``orchestrator.errors`` (so it maps), or a
    builtin that marks a bug or is caught where it is raised."""
    internal = {"ValueError", "AssertionError", "HTTPException"}  # HTTPException: the guard's 401, mapped in api.py
    raised = set()
    for folder in ("actors/controller", "orchestrator/service", "orchestrator/client"):
        for path in (ROOT / folder).rglob("*.py"):
            raised |= set(re.findall(r"raise (\w+Error|\w+Exception)\(", path.read_text()))
    assert raised - internal <= {cls.__name__ for cls in ALL}, raised - internal - {cls.__name__ for cls in ALL}


# ---- a request the models refuse: one line naming each field, the same on every surface ----------------------


def test_the_cli_names_the_field_a_request_got_wrong_in_one_line(capsys):
    # Before: pydantic's whole report ("1 validation error for ProfileRequest\nsteps\n  Input should ...\n  For further
    # information visit https://errors.pydantic.dev/...") with its newlines shown escaped on one line.
    assert main(["profile", "run", "--steps", "0", "--url", "http://127.0.0.1:9"]) == EXIT_USAGE
    assert capsys.readouterr().err == "rayprof: invalid_request: steps: Input should be greater than or equal to 1\n"


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(max_value=0), rank=st.integers(max_value=-1))
def test_every_refused_field_is_named_once_and_the_message_is_one_line(steps, rank):
    with pytest.raises(ValidationError) as refused:
        ProfileRequest(target="run", steps=steps, ranks=[0, rank])
    message = validation_problems(refused.value.errors())
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert message.startswith("steps: ") and "; ranks.1: " in message
