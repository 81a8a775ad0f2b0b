"""Fixtures and helpers of the console's Chromium tests (Debian's ``chromium``, driven by Playwright).

Test modules load this as a plugin (``pytest_plugins``) and import its helpers. Screenshots of each
page go to ``test-artifacts/screenshots/`` (gitignored); README's images in docs/img/ are copies of them.
PYTEST_DONT_REWRITE: imported as well as loaded, like tests/support/serve_fixtures.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from benchmarks._stored import CLUSTER, write_saved_profiles
from tests.support.common import LIVE_TARGET, REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
DONE_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs it (apt-get install -y chromium, as root)")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_job, service) -> Iterator[Any]:
    """A fresh tab; fails the test on any console error (a CSP violation is one)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.set_default_timeout(30_000)
    yield tab
    context.close()
    # A 401 the test provokes on purpose is logged as a failed resource load; anything else is a bug.
    assert [e for e in errors if "401" not in e] == []


@pytest.fixture(scope="module")
def stored(service, tmp_path_factory) -> Iterator[tuple[str, list[str]]]:
    """A second app whose control actor restored 120 stored profiles of 64 ranks; its URL and their ids."""
    import ray
    from ray import serve

    from actors.controller.actor import Controller
    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec
    from orchestrator.service.app import ProfilingService

    home = StorageSpec(uri=str(tmp_path_factory.mktemp("stored")))
    ids = write_saved_profiles(home, 120, 64)
    config = controller_config(home).model_copy(update={"cluster_name": CLUSTER})
    controller = ray.remote(Controller).options(num_cpus=0).remote(config)
    serve.run(ProfilingService.bind(controller=controller), name="rayprof-stored", route_prefix="/stored")
    yield f"{service.url}/stored", ids
    serve.delete("rayprof-stored")
    ray.kill(controller, no_restart=True)


def shot(tab: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    return path


def profile_from_form(tab: Any, url: str, steps: int = 3) -> str:
    """Start a profile of the live run from the Targets page's form; returns its id."""
    tab.goto(f"{url}/#/targets")
    form = tab.get_by_role("form", name=f"Profile {LIVE_TARGET}")
    form.get_by_label("Steps").fill(str(steps))
    form.get_by_role("button", name=f"Profile {LIVE_TARGET}").click()
    tab.wait_for_url(re.compile(r"#/profiles/.+"))
    tab.locator("#profile-state", has_text="DONE").wait_for(timeout=DONE_TIMEOUT_MS)
    return tab.url.rsplit("/", 1)[-1]
