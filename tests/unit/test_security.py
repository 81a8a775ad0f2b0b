"""Token sources, the exposure check, and the service's guards, headers and error bodies, without Ray.

The guards run here in a small FastAPI app wired like the service's; test_http_api.py
checks the same behaviour through the real Serve proxy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import httpx
import pytest
import yaml
from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.auth import check_exposure, host_of, is_loopback, read_token
from orchestrator.errors import ConfigurationError, RayprofError, StorageError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.service.security import (
    Guard,
    SecurityHeaders,
    rayprof_error_response,
    unexpected_error_response,
)
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from tests.support.common import REPO

# Module level: FastAPI resolves the (string) annotations of routes in this module's globals.
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


# ---- where the token comes from ---------------------------------------------


def test_no_token_anywhere_means_none():
    assert read_token() is None


def test_empty_token_variable_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV_VAR, "")

    with pytest.raises(ConfigurationError, match="RAYPROF_TOKEN is empty"):
        read_token()


def test_token_is_read_from_the_file_the_variable_names(monkeypatch, tmp_path):
    (tmp_path / "t").write_text("s3cret-token-0123456\n")
    monkeypatch.setenv(TOKEN_FILE_ENV_VAR, str(tmp_path / "t"))

    assert read_token() == "s3cret-token-0123456"


@pytest.mark.parametrize("content", ["", "  \n"])
def test_empty_token_file_is_a_configuration_error(tmp_path, content):
    (tmp_path / "t").write_text(content)

    with pytest.raises(ConfigurationError, match="is empty"):
        read_token(token_file=tmp_path / "t")


def test_missing_token_file_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="cannot read the token"):
        read_token(token_file=tmp_path / "nope")


def test_both_token_variables_set_is_ambiguous(monkeypatch, tmp_path):
    (tmp_path / "t").write_text("a")
    monkeypatch.setenv(TOKEN_FILE_ENV_VAR, str(tmp_path / "t"))
    monkeypatch.setenv(TOKEN_ENV_VAR, "b")

    with pytest.raises(ConfigurationError, match="set only one"):
        read_token()


@pytest.mark.parametrize("token", ["t", "fifteen-chars15"])
def test_a_token_under_16_characters_is_refused(token, tmp_path):
    (tmp_path / "t").write_text(token)

    with pytest.raises(ConfigurationError, match=f"is {len(token)} characters; a token needs at least 16"):
        read_token(token)
    with pytest.raises(ConfigurationError, match="at least 16"):
        read_token(token_file=tmp_path / "t")
    assert read_token("sixteen-chars-16") == "sixteen-chars-16"


def test_token_with_whitespace_is_refused():
    with pytest.raises(ConfigurationError, match="cannot have"):
        read_token("two words")


# ---- binding --------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_binds_need_no_token(host):
    assert is_loopback(host)
    check_exposure(host, None, insecure=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "myhost"])
def test_public_bind_without_a_token_is_refused(host):
    with pytest.raises(ConfigurationError, match="with no token"):
        check_exposure(host, None, insecure=False)


def test_public_bind_is_allowed_with_a_token_or_when_insecure():
    check_exposure("0.0.0.0", "t", insecure=False)
    check_exposure("0.0.0.0", None, insecure=True)


def test_deploy_config_with_a_public_host_and_no_token_fails_at_build_time(monkeypatch):
    """deploy/serve_config.yaml as `serve deploy` builds it, with http_options.host set to 0.0.0.0."""
    from orchestrator.service import app as service_app

    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    monkeypatch.setattr(service_app, "serve_http_host", lambda: "0.0.0.0")

    with pytest.raises(ConfigurationError, match="would listen on every interface with no token"):
        service_app.build_app(application.get("args"))


def test_deploy_config_builds_on_loopback_without_a_token(monkeypatch):
    from orchestrator.service import app as service_app

    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    monkeypatch.setattr(service_app, "serve_http_host", lambda: config["http_options"]["host"])

    built = service_app.build_app(application.get("args"))
    # The deployment Serve would run, with the config's settings: its storage, no token, not insecure.
    bound = built._bound_deployment
    assert bound.name == "ProfilingService"
    assert bound.init_kwargs == {
        "storage": StorageSpec(uri="file:///mnt/cluster_storage/rayprof"),
        "token": None,
        "insecure": False,
        "allowed_hosts": (),
        "mcp_read_only": False,
    }


@pytest.mark.parametrize(
    ("header", "host"),
    [("127.0.0.1:8000", "127.0.0.1"), ("[::1]:8000", "::1"), ("LocalHost.", "localhost"), ("evil.example", "evil.example")],
)
def test_host_header_is_reduced_to_its_host(header, host):
    assert host_of(header) == host


# ---- the guard, headers and error bodies in an app -------------------------------


def _app(guard: Guard) -> FastAPI:
    api = FastAPI()
    api.add_middleware(SecurityHeaders)
    api.add_exception_handler(RayprofError, rayprof_error_response)  # type: ignore[arg-type]
    api.add_exception_handler(Exception, unexpected_error_response)

    @api.get("/data")
    def data(request: Request, credentials: Credentials) -> dict:
        guard.check(request, credentials)
        return {"ok": True}

    @api.get("/boom")
    def boom() -> dict:
        raise RuntimeError("connect to 10.1.2.3:9000 failed")

    @api.get("/storage")
    def storage() -> dict:
        raise StorageError("cannot read s3://b/k: Could not connect to http://10.1.2.3:9000")

    return api


def _get(api: FastAPI, path: str, **headers: str) -> httpx.Response:
    """One request through the app's full ASGI stack, as the Serve proxy would send it."""

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(call())


def test_without_a_token_a_foreign_host_header_is_refused():
    api = _app(Guard(None))

    refused = _get(api, "/data", host="attacker.example")
    local = _get(api, "/data", host="127.0.0.1:8000")

    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_request" and "not allowed" in refused.json()["detail"]
    assert local.status_code == 200


def test_allowed_hosts_extend_the_loopback_names(monkeypatch):
    monkeypatch.setenv(ALLOWED_HOSTS_ENV_VAR, "prof.internal, other")
    api = _app(Guard(None, ("10.0.0.5",)))

    assert _get(api, "/data", host="prof.internal:8000").status_code == 200
    assert _get(api, "/data", host="10.0.0.5").status_code == 200
    assert _get(api, "/data", host="evil").status_code == 400


def test_with_a_token_any_host_with_the_token_is_answered():
    api = _app(Guard("tok"))

    assert _get(api, "/data", host="prof.example", authorization="Bearer tok").status_code == 200
    assert _get(api, "/data", host="prof.example").status_code == 401


def test_every_response_forbids_framing_and_sniffing():
    response = _get(_app(Guard(None)), "/data")

    assert response.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_unexpected_error_is_a_generic_500_with_an_id_in_the_log(caplog):
    with caplog.at_level(logging.ERROR, logger="orchestrator.service.security"):
        response = _get(_app(Guard(None)), "/boom")

    body = response.json()
    assert response.status_code == 500
    assert set(body) == {"error", "detail", "error_id"} and body["error"] == "internal_error"
    assert "10.1.2.3" not in response.text and "RuntimeError" not in response.text
    assert body["error_id"] in body["detail"]
    logged = [r for r in caplog.records if body["error_id"] in r.getMessage()]
    assert logged and logged[0].exc_info and "10.1.2.3" in str(logged[0].exc_info[1])


def test_storage_error_text_stays_in_the_log():
    response = _get(_app(Guard(None)), "/storage")

    assert response.status_code == 502
    assert response.json()["error"] == "storage_error"
    assert "10.1.2.3" not in response.text and "s3://" not in response.text
