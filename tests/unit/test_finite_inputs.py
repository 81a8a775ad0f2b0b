"""A timeout or duration that is not a finite number (inf, 1e400, nan) is a usage error everywhere: exit 2 from
the CLI before any request, 422 from the HTTP API, a ValidationError from the Python client. Never a traceback."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.cli.main import main
from orchestrator.models.requests import ProfileRequest
from tests.support.fake_agents import make_controller, run
from tests.support.inprocess_service import service_client

_NOT_FINITE = ["inf", "1e400", "-inf", "nan", "Infinity"]
# A port nothing listens on: every case must be refused before a request is made.
_NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize("value", _NOT_FINITE)
@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "run", "--steps", "2", "--window-timeout={}"],
        ["profile", "run", "--steps", "2", "--wait", "--timeout={}"],
        ["gc", "--grace-hours={}"],
        ["history", "run", "--span={}"],
        ["watch", "run", "--slower-than={}"],
    ],
)
def test_the_cli_refuses_a_number_that_is_not_finite_with_exit_2(argv, value, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*(a.format(value) for a in argv), "--url", _NOWHERE, "--json"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "finite" in err, err


def test_the_cli_still_takes_finite_numbers(capsys):
    # Reaches the (absent) service: refused for being unreachable (1), not for its numbers (2).
    assert main(["profile", "run", "--steps", "2", "--window-timeout", "30", "--url", _NOWHERE, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "controller_unavailable"


# What a number past a float's range reads as: written with any exponent from 309 on, or any sign of inf/nan.
_READS_NOT_FINITE = st.one_of(
    st.integers(min_value=309, max_value=100_000).map(lambda e: f"1e{e}"),
    st.sampled_from(["inf", "-inf", "Infinity", "nan", "NaN", "-nan"]),
)


@settings(max_examples=50, deadline=None)
@given(_READS_NOT_FINITE)
def test_a_profile_request_refuses_any_non_finite_timeout(text):
    assert not math.isfinite(float(text))
    with pytest.raises(ValidationError):
        ProfileRequest(target="run", steps=2, timeout_s=float(text))
    with pytest.raises(ValidationError):
        ProfileRequest.model_validate_json(f'{{"target": "run", "steps": 2, "timeout_s": {json.dumps(float(text))}}}')


def test_the_http_api_answers_422_for_a_non_finite_timeout(home, monkeypatch):
    async def scenario():
        c = make_controller(home)
        await c.ping()
        async with service_client(monkeypatch, c) as http:
            return [
                (
                    await http.post(
                        "/v1/profiles",
                        content=f'{{"target": "run", "steps": 2, "timeout_s": {literal}}}',
                        headers={"content-type": "application/json"},
                    )
                ).status_code
                for literal in ("Infinity", "-Infinity", "NaN", "1e400")
            ]

    assert run(scenario()) == [422] * 4
