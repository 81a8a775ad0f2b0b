"""Property-based fuzzing of the HTTP API from its own OpenAPI spec: no 5xx, no hang."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

pytest_plugins = ["tests.support.serve_fixtures"]
pytestmark = pytest.mark.integration

# 25 a route: ~30 s for the whole API on two cores.
EXAMPLES_PER_OPERATION = 25


def test_no_generated_request_gets_a_5xx_or_hangs(service):
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    calls: dict[str, int] = {}

    for result in schema.get_all_operations():
        operation = result.ok()

        # Driven through Hypothesis directly: schemathesis' pytest plugin does not run on pytest 9.
        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def fuzz(case):
            calls[case.operation.label] = calls.get(case.operation.label, 0) + 1
            # The request timeout is the "no hang" bound: a long-poll waits at most 30 s.
            case.call_and_validate(checks=[not_a_server_error], timeout=40)

        fuzz()

    print(f"fuzz cases per operation: {calls}")
    assert set(calls) >= {"POST /v1/profiles", "GET /v1/profiles/{profile_id}", "DELETE /v1/profiles/{profile_id}"}
