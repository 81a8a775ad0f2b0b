"""The console in headless Chromium against the real app served in process (uvicorn on one event
loop with the real ``Controller`` class and fake agents): what needs runs no live job can make."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from playwright.async_api import async_playwright

from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from tests.support.console_fixtures import CHROMIUM, CHROMIUM_ARGS
from tests.support.fake_agents import EVALUATING, FakeAgent, make_controller, run, worker_info
from tests.support.inprocess_service import install_service
from tests.support.serve_fixtures import free_port


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


@asynccontextmanager
async def served(app: Any):
    """``app`` on a free loopback port, on this event loop; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def tab():
    """A fresh Chromium tab; its console errors (a CSP violation is one) are collected in ``tab.errors``."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs it (apt-get install -y chromium, as root)")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = await browser.new_page()
        page.errors = []
        page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.set_default_timeout(30_000)
        try:
            yield page
        finally:
            await browser.close()


def test_two_runs_with_one_target_name_get_a_card_each_and_each_form_profiles_its_own_run(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = [FakeAgent(c, worker_info(0, 1, job=job)) for job in ("job1", "job2")]
        for a in agents:
            await a.start()
        async with served(install_service(monkeypatch, c)) as url, tab() as page:
            await page.goto(f"{url}/#/targets")
            cards = page.locator('section.target[data-target="run"]')
            await page.locator('section.target[data-run="job2"]').wait_for()
            await page.locator('section.target[data-run="job1"]').wait_for()
            await asyncio.sleep(2.5)  # a refresh of the live parts: cards must not merge or swap
            runs = sorted([await card.get_attribute("data-run") for card in await cards.all()])
            form = page.get_by_role("form", name="Profile run (run job1)")
            await form.get_by_label("Steps").fill("2")
            await form.get_by_role("button", name="Profile run").click()
            await page.wait_for_url("**/#/profiles/*")
            profile_id = page.url.rsplit("/", 1)[-1]
            errors = list(page.errors)
        status = await c.get(profile_id)
        for a in agents:
            await a.stop()
        return runs, status, [len(a.windows) for a in agents], errors

    runs, status, windows, errors = run(go(), timeout_s=120)
    assert runs == ["job1", "job2"]
    assert status.request.run == "job1" and windows == [1, 0]
    assert errors == []


def test_docs_page_renders_the_api_with_nothing_from_outside_the_service(home, monkeypatch):
    async def go():
        c = make_controller(home)
        async with served(install_service(monkeypatch, c)) as url, tab() as page:
            asked: list[str] = []
            page.on("request", lambda request: asked.append(request.url))
            # An offline cluster: nothing but the service answers.
            await page.route(
                "**/*", lambda route: route.continue_() if route.request.url.startswith(url) else route.abort()
            )
            await page.goto(f"{url}/docs")
            await page.locator(".opblock").first.wait_for()
            operations = await page.locator(".opblock").count()
            stacks = await page.locator(".opblock-post", has_text="/v1/targets/{target}/stacks").count()
            errors = list(page.errors)
        return url, asked, operations, stacks, errors

    url, asked, operations, stacks, errors = run(go(), timeout_s=120)
    assert [u for u in asked if not u.startswith(url) and not u.startswith("data:")] == []
    assert operations >= 15 and stacks == 1
    assert errors == []


def test_a_stacks_page_says_what_its_ranks_frames_say_they_are_doing(home, monkeypatch):
    async def go():
        c = make_controller(home)
        agents = [FakeAgent(c, worker_info(r, 2)) for r in range(2)]
        for a in agents:
            await a.start()
            a.stack = list(EVALUATING)
        bundle = await c.stacks("run")
        async with served(install_service(monkeypatch, c)) as url, tab() as page:
            await page.goto(f"{url}/#/stacks/{bundle.id}")
            doing = await page.locator("p.activity").inner_text()
            errors = list(page.errors)
        for a in agents:
            await a.stop()
        return bundle, doing, errors

    bundle, doing, errors = run(go(), timeout_s=120)
    assert bundle.summary.startswith("ranks 0, 1 are evaluating (trainer.py:2871 in evaluate), in forward")
    assert doing == "doing: evaluating (trainer.py:2871 in evaluate)"
    assert errors == []
