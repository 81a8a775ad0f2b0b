"""A submit's Idempotency-Key through every way in (HTTP header, Python client, CLI option), and the
503s of a controller that is restoring or whose cluster name is taken, as HTTP answers them. The real
service app in process (tests/support/inprocess_service.py) in front of the real ``Controller`` class."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest

from actors.controller.actor import Controller
from orchestrator import ProfilingClient
from orchestrator.cli.main import main
from orchestrator.client import http as http_backend
from orchestrator.errors import IdempotencyKeyReusedError, InvalidRequestError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import utcnow
from orchestrator.models.profile import ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from tests.support.fake_agents import fast_config, make_controller, no_postprocess, run, start_agents, wait_terminal
from tests.support.inprocess_service import service_client
from tests.support.local_recorder import LocalRecorders

BODY = {"target": "run", "steps": 3}


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


def test_a_post_retried_with_its_idempotency_key_returns_the_first_profile(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 1)
        async with service_client(monkeypatch, c) as http:
            first = await http.post("/v1/profiles", json=BODY, headers={"Idempotency-Key": "job-42-try"})
            retried = await http.post("/v1/profiles", json=BODY, headers={"Idempotency-Key": "job-42-try"})
            other_body = await http.post(
                "/v1/profiles", json={**BODY, "steps": 4}, headers={"Idempotency-Key": "job-42-try"}
            )
            bad_key = await http.post("/v1/profiles", json=BODY, headers={"Idempotency-Key": "has a space"})
            await wait_terminal(c, first.json()["id"])
            listed = (await http.get("/v1/profiles")).json()["total"]
        for a in agents:
            await a.stop()
        return first, retried, other_body, bad_key, listed

    first, retried, other_body, bad_key, listed = run(go())
    assert first.status_code == retried.status_code == 202
    assert retried.json()["id"] == first.json()["id"]
    assert other_body.status_code == 422 and other_body.json()["error"] == "idempotency_key_reused"
    assert first.json()["id"] in other_body.json()["detail"]
    assert bad_key.status_code == 422 and bad_key.json()["error"] == "validation_error"
    assert listed == 1


def test_calls_on_saved_state_answer_503_restoring_until_it_is_restored(tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the storage root should be")
    broken = StorageSpec(uri=str(blocker / "store"))

    async def go():
        c = Controller(fast_config(broken), postprocess=no_postprocess, cluster="fake-ray-cluster", recorder=LocalRecorders())
        async with service_client(monkeypatch, c) as http:
            return await http.get("/v1/storage"), await http.get("/healthz")

    storage, health = run(go())
    assert storage.status_code == 503
    assert storage.json()["error"] == "restoring" and "not restored its saved state" in storage.json()["detail"]
    assert health.status_code == 200


def test_a_refused_cluster_name_is_a_503_that_names_the_fix(home, monkeypatch):
    async def go():
        holder = Controller(fast_config(home, cluster_name="shared"), postprocess=no_postprocess, cluster="ray-a", recorder=LocalRecorders())
        await holder.ping()
        refused = Controller(fast_config(home, cluster_name="shared"), postprocess=no_postprocess, cluster="ray-b", recorder=LocalRecorders())
        async with service_client(monkeypatch, refused) as http:
            return await http.get("/healthz"), await http.post("/v1/profiles", json=BODY)

    health, submit = run(go())
    for response in (health, submit):
        assert response.status_code == 503
        assert response.json()["error"] == "cluster_name_in_use"
        assert "RAYPROF_CLUSTER_NAME" in response.json()["detail"]


# ---- the Python client and the CLI send the key ---------------------------------------


def _status(request: httpx.Request) -> dict:
    body = json.loads(request.content)
    status = ProfileStatus(
        id="prof-20250101-000000-0000abcd",
        target=body["target"],
        state=ProfileState.PENDING,
        request=ProfileRequest.model_validate(body),
        storage_uri="file:///x/run/prof-20250101-000000-0000abcd",
        created_at=utcnow(),
    )
    return status.model_dump(mode="json")


class Recorder:
    """A stand-in service that answers submits and keeps the requests it got."""

    def __init__(self, reused: bool = False) -> None:
        self.requests: list[httpx.Request] = []
        self.reused = reused

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.reused:
            return httpx.Response(422, json={"error": "idempotency_key_reused", "detail": "used for another request"})
        return httpx.Response(202, json=_status(request))


def test_the_client_sends_its_idempotency_key_and_raises_on_a_reused_one():
    sent = Recorder()
    client = ProfilingClient(backend=http_backend.HttpBackend("http://svc", transport=httpx.MockTransport(sent)))
    client.profile("run", 3, idempotency_key="nightly-7")
    client.profile("run", 3)
    reused = ProfilingClient(
        backend=http_backend.HttpBackend("http://svc", transport=httpx.MockTransport(Recorder(reused=True)))
    )

    assert sent.requests[0].headers["idempotency-key"] == "nightly-7"
    assert "idempotency-key" not in sent.requests[1].headers
    with pytest.raises(IdempotencyKeyReusedError):
        reused.profile("run", 3, idempotency_key="nightly-7")


def test_the_cli_profile_command_sends_its_idempotency_key(monkeypatch, capsys):
    sent = Recorder()
    backend = partial(http_backend.HttpBackend, transport=httpx.MockTransport(sent))
    monkeypatch.setattr(http_backend, "HttpBackend", backend)

    code = main(["profile", "run", "--steps", "3", "--idempotency-key", "ci-run-991", "--url", "http://svc"])

    assert code == 0
    assert [r.headers.get("idempotency-key") for r in sent.requests] == ["ci-run-991"]
    assert capsys.readouterr().out.strip() == "prof-20250101-000000-0000abcd"


def test_an_invalid_key_is_refused_before_any_request():
    sent = Recorder()
    client = ProfilingClient(backend=http_backend.HttpBackend("http://svc", transport=httpx.MockTransport(sent)))

    with pytest.raises(InvalidRequestError, match="invalid idempotency key"):
        client.profile("run", 3, idempotency_key="x" * 256)
    assert sent.requests == []
