"""Request validation at the boundary."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.models import ProfileRequest, ProfileState


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
