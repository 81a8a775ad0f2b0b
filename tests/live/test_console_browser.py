"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Screenshots of each page go to ``test-artifacts/screenshots/`` (gitignored);
README's images in docs/img/ are copies of them. The new pages (stacks, watches,
a target's state and history, device-idle bars) are in tests/live/test_console_pages.py.
"""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.support.common import LIVE_TARGET
from tests.support.console_fixtures import profile_from_form, shot

pytest_plugins = ["tests.support.serve_fixtures", "tests.support.console_fixtures"]
pytestmark = pytest.mark.integration


def test_console_is_served_with_a_strict_content_security_policy(service):
    response = httpx.get(f"{service.url}/", timeout=30)

    assert response.status_code == 200
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    assert '<script src="console/app.js"' in response.text and "<style" not in response.text


def test_targets_page_shows_the_live_run_its_ranks_and_a_step_time_chart(page, service):
    page.goto(f"{service.url}/")

    card = page.locator(f'section[data-target="{LIVE_TARGET}"]')
    card.wait_for()
    assert card.locator("tbody tr").count() == 2
    lines = card.locator("svg polyline")
    expect(lines).to_have_count(2)
    # Each rank's line gains a point per refresh (every 2 s): wait for a second one.
    for i in range(2):
        expect(lines.nth(i)).to_have_attribute("points", re.compile(r"\S+ \S+"), timeout=30_000)


def test_form_starts_a_3_step_profile_that_reaches_done_and_shows_its_report(page, service):
    profile_id = profile_from_form(page, service.url, steps=3)

    frame = page.frame_locator("iframe.report")
    frame.locator("h1").wait_for()
    assert profile_id in page.locator("h1").first.inner_text()
    # Sandboxed: no script runs in it (same-origin only so that the console can size it to the report).
    assert page.locator("iframe.report").get_attribute("sandbox") == "allow-same-origin"
    links = page.locator("table a[download]")
    assert links.count() >= 5  # 2 traces, 2 op tables, merged trace, report
    assert page.get_by_role("heading", name="Open in Perfetto").is_visible()
    merged = page.get_by_role("link", name="merged.trace.json.gz").first.get_attribute("href")
    assert httpx.get(f"{service.url}{merged}", timeout=30).content[:2] == b"\x1f\x8b"
    # Shown whole (the frame grows to the report's height once it has loaded).
    page.wait_for_function(
        "f => f.offsetHeight >= f.contentDocument.documentElement.scrollHeight",
        arg=page.locator("iframe.report").element_handle(),
    )
    shot(page, "profile")


def test_profiles_page_lists_profiles_newest_first_with_their_state(page, service):
    profile_from_form(page, service.url, steps=3)

    page.goto(f"{service.url}/#/profiles")
    # A hash route: the profile page's tables stay until the list has rendered with its pager.
    page.locator(".pager").wait_for()
    first = page.locator("main table tbody tr").first
    assert "DONE" in first.inner_text()
    assert re.search(r"1–\d+ of \d+", page.locator(".pager").inner_text())
    shot(page, "profiles")


def test_compare_page_shows_the_diff_of_two_profiles(page, service):
    before = profile_from_form(page, service.url, steps=4)
    after = profile_from_form(page, service.url, steps=4)

    page.goto(f"{service.url}/#/compare")
    page.get_by_label("Before (A)").select_option(before)
    page.get_by_label("After (B)").select_option(after)
    page.get_by_role("button", name="Compare").click()

    diff = page.locator("#diff")
    diff.wait_for()
    text = diff.inner_text()
    assert f"{before} → {after}" in text
    assert "step time" in text and "data" in text
    shot(page, "compare")


def test_every_control_has_a_label_and_the_keyboard_reaches_the_profile_form(page, service):
    page.goto(f"{service.url}/#/targets")
    page.locator(f'section[data-target="{LIVE_TARGET}"] form').wait_for()

    unlabeled = page.evaluate(
        "[...document.querySelectorAll('input, select')]"
        ".filter(e => e.labels.length === 0 && !e.getAttribute('aria-label')).map(e => e.id)"
    )
    assert unlabeled == []
    # A card's controls are its run's: their ids carry the target and the run.
    steps = page.locator(f'section[data-target="{LIVE_TARGET}"] input[name="steps"]').get_attribute("id")
    assert steps.startswith(f"{LIVE_TARGET}/") and steps.endswith("-steps")
    focused = []
    for _ in range(40):
        page.keyboard.press("Tab")
        focused.append(page.evaluate("document.activeElement.id || document.activeElement.textContent"))
        if focused[-1] == steps:
            break
    header = ["rayprof", "nav-targets", "nav-profiles", "nav-watches", "nav-compare", "token-input", "token-save", "token-forget"]
    assert focused[: len(header)] == header
    assert focused[-1] == steps


def test_token_typed_once_is_sent_as_a_bearer_header_for_the_tab(page, service):
    page.goto(f"{service.secure_url}/#/targets")
    page.locator("#status.error", has_text="unauthorized").wait_for()

    page.get_by_label("API token").fill(service.token)
    page.get_by_label("API token").press("Enter")

    page.locator(f'section[data-target="{LIVE_TARGET}"]').wait_for()
    assert page.evaluate("sessionStorage.getItem('rayprof-token')") == service.token


def test_profiles_page_shows_stored_profiles_newest_first_with_rank_counts(browser, stored):
    url, ids = stored
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()

    tab.goto(f"{url}/#/profiles")
    rows = tab.locator("main table tbody tr")
    rows.nth(49).wait_for()

    assert rows.count() == 50
    assert ids[-1] in rows.first.inner_text() and "64 DONE" in rows.first.inner_text()
    assert "1–50 of 120" in tab.locator(".pager").inner_text()
    context.close()
