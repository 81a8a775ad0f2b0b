"""Request validation at the boundary."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.models.profile import Artifact, Manifest
from orchestrator.models.requests import ProfileRequest, ProfileState


@pytest.mark.parametrize("name", ["../etc", "a/b", "a..b", "", ".hidden", "a\\b", "x" * 129])
def test_unsafe_target_names_are_rejected(name):
    with pytest.raises(ValidationError):
        ProfileRequest(target=name, steps=1)


@pytest.mark.parametrize("steps", [0, -1])
def test_non_positive_steps_are_rejected(steps):
    with pytest.raises(ValidationError, match="steps"):
        ProfileRequest(target="run", steps=steps)


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="storage"):
        ProfileRequest.model_validate({"target": "run", "steps": 1, "storage": "s3://elsewhere"})


def test_negative_rank_is_rejected():
    with pytest.raises(ValidationError, match="ranks"):
        ProfileRequest(target="run", steps=1, ranks=[-1])


def test_request_round_trips_through_json():
    request = ProfileRequest(target="my-run_1.v2", steps=5, record_shapes=True, ranks=[0, 3])
    assert ProfileRequest.model_validate_json(request.model_dump_json()) == request


def test_terminal_states_are_exactly_the_four_endings():
    terminal = {s for s in ProfileState if s.is_terminal}
    assert terminal == {ProfileState.DONE, ProfileState.PARTIAL, ProfileState.FAILED, ProfileState.CANCELLED}


def test_package_exports_every_public_error():
    import orchestrator
    from orchestrator import errors

    public = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.RayprofError)}
    assert public <= set(orchestrator.__all__)


def test_empty_rank_list_is_rejected():
    with pytest.raises(ValidationError, match="ranks"):
        ProfileRequest(target="run", steps=1, ranks=[])


def _manifest(**fields) -> dict:
    base = {
        "profile_id": "prof-1",
        "target": "run",
        "status": "DONE",
        "request": {"target": "run", "steps": 1},
        "storage_uri": "file:///store/run/prof-1",
        "start_step": 1,
        "stop_step": 2,
        "ranks": [],
        "requested_at": "2024-01-01T00:00:00Z",
        "finished_at": "2024-01-01T00:00:01Z",
    }
    return {**base, **fields}


@pytest.mark.parametrize("profile_id", ["/tmp/x", "../../x", "..", "a/b", "a\x00b", "a\x1b[2Jb", "x" * 129])
def test_manifest_with_an_unsafe_profile_id_is_rejected(profile_id):
    with pytest.raises(ValidationError, match="profile_id"):
        Manifest.model_validate(_manifest(profile_id=profile_id))


@pytest.mark.parametrize("target", ["/etc", "../x", "a/b", "run\n"])
def test_manifest_with_an_unsafe_target_is_rejected(target):
    with pytest.raises(ValidationError, match="target"):
        Manifest.model_validate(_manifest(target=target))


@pytest.mark.parametrize(
    "key", ["/etc/passwd", "../x", "traces/../../x", "a//b", "./a", "a\\b", "a\x00b", "a\x1bb", "x" * 1025, ""]
)
def test_artifact_keys_that_could_escape_a_folder_are_rejected(key):
    with pytest.raises(ValidationError, match="key"):
        Artifact(kind="trace", key=key, uri="file:///x", bytes=0, sha256="0" * 64)


def test_ordinary_artifact_keys_are_accepted():
    key = "traces/rank0.host-1.42.pt.trace.json.gz"

    assert Artifact(kind="trace", key=key, uri="file:///x", bytes=0, sha256="0" * 64).key == key


def _window() -> dict:
    return {
        "profile_id": "p1", "target": "run", "start_step": 10, "steps": 2, "warmup": 0, "options": {},
        "storage": {"uri": "file:///tmp/x"}, "prefix": "profiles/p1", "max_trace_bytes": 1,
    }


def test_a_nodes_commands_validate_each_as_its_own_kind():
    from orchestrator.models.agent_protocol import (
        ArmCommand,
        CancelCommand,
        MemoryHistoryCommand,
        NodeReply,
        RegisterCommand,
        StacksCommand,
        SyncCommand,
    )

    commands = [
        {"kind": "sync"}, {"kind": "arm", "window": _window()}, {"kind": "cancel", "profile_id": "p1"},
        {"kind": "register"}, {"kind": "stacks", "profile_id": "b1", "native": True}, {"kind": "memory_history", "record": True},
    ]
    reply = NodeReply.model_validate({"commands": {"agent": commands}})
    got = reply.commands["agent"]
    assert [type(c) for c in got] == [
        SyncCommand, ArmCommand, CancelCommand, RegisterCommand, StacksCommand, MemoryHistoryCommand
    ]
    assert NodeReply.model_validate_json(reply.model_dump_json()) == reply


@pytest.mark.parametrize(
    "command",
    [{"kind": "arm"}, {"kind": "cancel"}, {"kind": "stacks"}, {"kind": "memory_history"}, {"kind": "sync", "window": _window()},
     {"kind": "nap"}, {}],
)
def test_a_command_without_what_its_kind_needs_or_with_what_it_does_not_is_rejected(command):
    from orchestrator.models.agent_protocol import NodeReply

    with pytest.raises(ValidationError):
        NodeReply.model_validate({"commands": {"agent": [command]}})


def test_a_command_survives_the_pickling_ray_does_as_its_own_kind():
    import pickle

    from orchestrator.models.agent_protocol import ArmCommand, NodeReply, StacksCommand, WindowSpec

    reply = NodeReply(commands={"a": [ArmCommand(window=WindowSpec.model_validate(_window())), StacksCommand(profile_id="b1")]})
    again = pickle.loads(pickle.dumps(reply))
    assert again == reply and [type(c) for c in again.commands["a"]] == [ArmCommand, StacksCommand]
