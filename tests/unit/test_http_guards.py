"""The real service app in process (tests/support/inprocess_service.py) with fake agents: what a page of
another web site can make a browser do, the API docs page, and signed artifact links."""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.service.console import CONSOLE_CSP
from orchestrator.service.security import link_key
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from tests.support.fake_agents import make_controller, run, start_agents, wait_terminal
from tests.support.inprocess_service import BASE_URL, service_client

TOKEN = "a-test-token-of-24-chars"
EVIL = "https://evil.example"


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


async def _stacks_listed(c) -> list[str]:
    return [p.id for p in (await c.list()).profiles if p.kind == "stacks"]


# ---- item 12: nothing that acts is a GET; another site's pages are refused ----------------------


def test_taking_stacks_is_a_post_and_a_get_takes_none(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        async with service_client(monkeypatch, c) as http:
            # What an <img src> on any web page would send.
            got = await http.get("/v1/targets/run/stacks", params={"native": "true"})
            after_get = await _stacks_listed(c)
            posted = await http.post("/v1/targets/run/stacks", json={"native": False})
            after_post = await _stacks_listed(c)
            stored = await http.get(posted.headers["location"])
        for a in agents:
            await a.stop()
        return got, after_get, posted, after_post, stored

    got, after_get, posted, after_post, stored = run(go())
    assert got.status_code == 405 and got.json()["error"] == "method_not_allowed"
    assert after_get == []
    assert posted.status_code == 201 and posted.json()["state"] == "DONE"
    assert after_post == [posted.json()["id"]]
    assert posted.headers["location"] == f"{BASE_URL}/v1/profiles/{posted.json()['id']}"
    assert stored.status_code == 200 and stored.json()["kind"] == "stacks"


def test_a_post_sent_by_another_sites_page_is_refused_with_403_and_acts_on_nothing(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        async with service_client(monkeypatch, c) as http:
            answers = {
                # A <form> on evil.example posting to the service: the browser names the page's origin.
                "stacks": await http.post("/v1/targets/run/stacks", headers={"origin": EVIL}),
                "profile": await http.post(
                    "/v1/profiles", json={"target": "run", "steps": 1}, headers={"origin": EVIL}
                ),
                # A sandboxed frame or a file sends Origin: null.
                "null": await http.post("/v1/targets/run/stacks", headers={"origin": "null"}),
                # A browser that leaves Origin out still says where the request came from.
                "fetch-site": await http.post("/v1/targets/run/stacks", headers={"sec-fetch-site": "cross-site"}),
                "read": await http.get("/v1/targets", headers={"origin": EVIL}),
            }
            listed = (await c.list()).profiles
            own = await http.post("/v1/targets/run/stacks", headers={"origin": BASE_URL})
            localhost = await http.post("/v1/targets/run/stacks", headers={"origin": "http://localhost:8000"})
        for a in agents:
            await a.stop()
        return answers, listed, own, localhost

    answers, listed, own, localhost = run(go())
    for what, answer in answers.items():
        assert answer.status_code == 403, what
        assert answer.json()["error"] == "forbidden", what
    assert "evil.example" in answers["stacks"].json()["detail"]
    assert listed == []
    assert own.status_code == 201 and localhost.status_code == 201


def test_with_a_token_a_foreign_origin_is_refused_even_with_the_token(home, monkeypatch):
    async def go():
        c = make_controller(home)
        async with service_client(monkeypatch, c, token=TOKEN) as http:
            auth = {"authorization": f"Bearer {TOKEN}"}
            return (
                await http.get("/v1/targets", headers={**auth, "origin": EVIL}),
                await http.get("/v1/targets", headers={**auth, "origin": "https://prof.example"}),
                await http.get("/v1/targets", headers={**auth, "origin": "https://prof.example", "host": "prof.example"}),
            )

    evil, other, own = run(go())
    assert evil.status_code == 403 and other.status_code == 403
    assert own.status_code == 200


# ---- item 13: the docs page runs only the service's own files -----------------------------------


def test_docs_page_loads_only_files_the_service_serves_under_the_console_policy(home, monkeypatch):
    async def go():
        c = make_controller(home)
        async with service_client(monkeypatch, c) as http:
            page = await http.get("/docs")
            refs = re.findall(r'(?:src|href)="([^"]*)"', page.text)
            files = {ref: await http.get(urljoin(f"{BASE_URL}/docs", ref)) for ref in refs if not ref.startswith("data:")}
            redoc = await http.get("/redoc")
        return page, refs, files, redoc

    page, refs, files, redoc = run(go())
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CONSOLE_CSP
    assert "docs/swagger-ui-bundle.js" in refs and "docs/init.js" in refs and "docs/swagger-ui.css" in refs
    for ref in refs:
        assert not urlsplit(ref).scheme or ref.startswith("data:"), ref
        assert not ref.startswith("//"), ref
    for ref, answer in files.items():
        assert answer.status_code == 200, ref
        assert answer.headers["content-security-policy"] == CONSOLE_CSP, ref
    assert len(files["docs/swagger-ui-bundle.js"].content) > 500_000  # Swagger UI itself, from the package
    init = files["docs/init.js"].text
    assert "validatorUrl: null" in init and "http" not in init.replace('"openapi.json"', "")
    assert redoc.status_code == 404


def test_the_schema_is_behind_the_token(home, monkeypatch):
    async def go():
        c = make_controller(home)
        async with service_client(monkeypatch, c, token=TOKEN) as http:
            return (
                await http.get("/openapi.json"),
                await http.get("/openapi.json", headers={"authorization": f"Bearer {TOKEN}"}),
                await http.get("/docs"),
            )

    without, authed, page = run(go())
    assert without.status_code == 401
    assert authed.status_code == 200 and "/v1/targets/{target}/stacks" in authed.json()["paths"]
    assert set(authed.json()["paths"]["/v1/targets/{target}/stacks"]) == {"post"}
    # The page holds nothing: it loads without the token, and the schema with the console's.
    assert page.status_code == 200


# ---- item 14: signed links and token length -------------------------------------------------------


def test_signed_links_are_keyed_by_a_key_derived_from_the_token_not_the_token(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 1)
        submitted = await c.submit(ProfileRequest(target="run", steps=2))
        status, _ = await wait_terminal(c, submitted.id)
        async with service_client(monkeypatch, c, token=TOKEN) as http:
            links = await http.get(f"/v1/profiles/{submitted.id}/links", headers={"authorization": f"Bearer {TOKEN}"})
            (artifact,) = links.json()["artifacts"]
            followed = await http.get(artifact["url"])
            tampered = await http.get(artifact["url"][:-4] + "0000")
        for a in agents:
            await a.stop()
        return status, artifact, followed, tampered

    status, artifact, followed, tampered = run(go())
    assert status.state == ProfileState.DONE
    query = parse_qs(urlsplit(artifact["url"]).query)
    signed = f"{status.id}/{artifact['key']}@{query['expires'][0]}".encode()
    signature = query["signature"][0]
    assert signature != hmac.new(TOKEN.encode(), signed, hashlib.sha256).hexdigest()
    assert signature == hmac.new(link_key(TOKEN), signed, hashlib.sha256).hexdigest()
    assert followed.status_code == 200 and tampered.status_code == 401


def test_the_service_refuses_to_start_with_a_token_under_16_characters(home, monkeypatch):
    with pytest.raises(ConfigurationError, match="at least 16"):
        service_client(monkeypatch, make_controller(home), token="fifteen-chars15")
