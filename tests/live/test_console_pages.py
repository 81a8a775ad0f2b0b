"""The console's pages of issue 25 (a target's state, lag and history; stacks; watches) and issue 24's
device-idle bars, in a real headless Chromium against the live job.

Where the live job cannot show a state on demand (STALLED, a lagging rank, a watch that fired, a GPU
trace's idle attribution), the test answers the browser's one API call with the live answer changed
to that state, checked through the API's own models first, so the page is tested on what the API can say.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from orchestrator.analysis.report import IDLE_COLORS
from orchestrator.models.diagnosis import WatchStatus
from orchestrator.service.views import TargetList, WatchList
from tests.support.common import LIVE_TARGET
from tests.support.console_fixtures import profile_from_form, shot
from tests.support.realtraces import external

pytest_plugins = ["tests.support.serve_fixtures", "tests.support.console_fixtures"]
pytestmark = pytest.mark.integration


def _rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _answer_with(tab: Any, pattern: str, change: Any) -> None:
    """Answer the browser's requests matching ``pattern`` with the live answer passed through ``change``."""

    def handle(route: Any) -> None:
        body = change(route.fetch().json())
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    tab.route(re.compile(pattern), handle)


def test_a_target_shows_running_and_its_step_time_history_with_its_profiles_marked(page, service):
    profile_id = profile_from_form(page, service.url, steps=3)

    page.goto(f"{service.url}/#/targets")
    card = page.locator(f'section[data-target="{LIVE_TARGET}"]')
    expect(card.locator(".health")).to_have_text(re.compile(r"^running"))
    expect(card.locator(".lag")).to_have_text("No rank lags behind.")
    chart = card.locator("svg.history")
    expect(chart.locator("polyline")).to_have_count(2)
    expect(chart.locator("polyline").first).to_have_attribute("points", re.compile(r"\S+ \S+"))
    # The profile taken a moment ago is marked on the chart and listed under it, linking to its page.
    expect(chart.locator("line.mark-profile title", has_text=profile_id)).to_have_count(1)
    link = card.get_by_role("link", name=re.compile(f"profile {profile_id}"))
    expect(link).to_have_attribute("href", f"#/profiles/{profile_id}")

    # The span choice reaches the API and the chart is redrawn over it.
    with page.expect_request(re.compile(r"/history\?span_s=300")):
        card.get_by_label("History span").select_option("300")
    expect(chart.locator("polyline")).to_have_count(2)
    card.get_by_label("History span").select_option("900")
    expect(chart).to_have_attribute("aria-label", re.compile(r"over 15 min$"))
    shot(page, "targets")


def test_a_stalled_target_with_a_lagging_rank_says_so_and_how_far_behind(page, service):
    fired_at = datetime.now(timezone.utc).isoformat()

    def stalled(body: dict[str, Any]) -> dict[str, Any]:
        for t in body["targets"]:
            t.update(
                health="STALLED", stalled_s=95.0, stall_threshold_s=60.0, lagging_ranks=[1], stall_stacks="stk-test",
                stall_verdict="ranks 0, 1 are evaluating (trainer.py:2871 in evaluate), in forward (linear.py:134)",
            )
            for w in t["ranks"]:
                w["steps_behind"] = 12 if w["info"]["world_rank"] == 1 else 0
        return TargetList.model_validate(body).model_dump(mode="json")

    def fired(body: dict[str, Any]) -> dict[str, Any]:
        watch = WatchStatus.model_validate({
            "id": "w-test", "spec": {"target": LIVE_TARGET, "rank_lag": 10, "action": "stacks"},
            "created_at": fired_at, "state": "COOLDOWN",
            "firings": [{"at": fired_at, "trigger": {"kind": "rank_lag", "at": fired_at, "detail": "rank 1 is 12 steps behind"}}],
        })
        return WatchList(watches=[watch]).model_dump(mode="json")

    _answer_with(page, r"/v1/targets$", stalled)
    _answer_with(page, r"/v1/watches$", fired)
    page.goto(f"{service.url}/#/targets")

    card = page.locator(f'section[data-target="{LIVE_TARGET}"]')
    expect(card.locator(".health")).to_have_text(re.compile(r"STALLED: no rank advanced for 95 s \(threshold 60 s\)"))
    expect(card.locator(".stall-verdict")).to_have_text(
        " · they show: ranks 0, 1 are evaluating (trainer.py:2871 in evaluate), in forward (linear.py:134)"
    )
    expect(card.locator(".lag")).to_have_text("Lagging: rank 1 (12 steps behind)")
    expect(card.locator('tr[data-rank="1"]')).to_have_class("lagging")
    expect(card.locator('tr[data-rank="0"]')).not_to_have_class("lagging")
    # The watch's firing is marked on the history chart and listed under it.
    expect(card.locator("svg.history line.mark-firing title")).to_have_text("watch w-test fired: rank 1 is 12 steps behind")
    shot(page, "targets-stalled")


def test_the_stacks_button_takes_stacks_and_opens_the_bundle_page(page, service):
    page.goto(f"{service.url}/#/targets")
    page.get_by_role("button", name=f"Take stacks of {LIVE_TARGET}").click()

    page.wait_for_url(re.compile(r"#/stacks/stk-.+"))
    expect(page.locator("#stacks-state")).to_have_text("DONE")
    bundle_id = page.url.rsplit("/", 1)[-1]
    stored = httpx.get(f"{service.url}/v1/profiles/{bundle_id}", timeout=30).json()
    assert stored["kind"] == "stacks"
    # Groups cover both ranks, the verdict on collectives is there, each rank's file opens on demand.
    groups = page.locator(".stack-group h3")
    assert re.search(r"ranks? 0", " ".join(groups.all_inner_texts()))
    expect(page.get_by_role("heading", name="Collectives (torch flight recorder)")).to_be_visible()
    rank0 = page.locator('details.rank[data-rank="0"]')
    rank0.locator("summary").press("Enter")
    expect(rank0.locator("pre")).to_contain_text("(training thread)")
    expect(rank0.locator("pre")).to_contain_text('File "')
    assert page.locator("details.rank").count() == 2
    # A bundle listed with the profiles links to this page.
    page.goto(f"{service.url}/#/profiles")
    expect(page.get_by_role("link", name=bundle_id)).to_have_attribute("href", f"#/stacks/{bundle_id}")
    page.goto(f"{service.url}/#/stacks/{bundle_id}")
    rank0 = page.locator('details.rank[data-rank="0"]')
    rank0.locator("summary").click()
    expect(rank0.locator("pre")).to_contain_text("(training thread)")
    shot(page, "stacks")


def test_the_watches_page_creates_lists_and_deletes_a_watch_with_the_keyboard(page, service):
    page.goto(f"{service.url}/#/watches")
    form = page.get_by_role("form", name="Create a watch")
    expect(form.get_by_label("Target")).to_have_value(LIVE_TARGET)
    form.get_by_label("a rank this many steps behind the leader", exact=True).check()
    form.get_by_label(re.compile(r"steps behind the leader \(steps\)")).fill("1000")
    form.get_by_label("holds for").fill("1m")
    form.get_by_label("take every rank's stacks").check()
    form.get_by_label("cooldown").fill("2h")
    form.get_by_role("button", name="Create watch").press("Enter")

    row = page.locator("#watch-list tbody tr").filter(has_text="a rank 1000+ steps behind the leader")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("take every rank's stacks")
    expect(row.locator(".state")).to_have_text("WAITING")
    watch_id = row.get_attribute("data-watch")
    (made,) = [w for w in httpx.get(f"{service.url}/v1/watches", timeout=30).json()["watches"] if w["id"] == watch_id]
    assert made["spec"]["target"] == LIVE_TARGET
    assert (made["spec"]["rank_lag"], made["spec"]["action"], made["spec"]["for_s"], made["spec"]["cooldown_s"]) == (1000, "stacks", 60, 7200)
    unlabeled = page.evaluate(
        "[...document.querySelectorAll('input, select')]"
        ".filter(e => e.labels.length === 0 && !e.getAttribute('aria-label')).map(e => e.id)"
    )
    assert unlabeled == []
    shot(page, "watches")

    page.get_by_role("button", name=f"Delete watch {watch_id}").press("Enter")
    expect(page.locator(f'#watch-list tr[data-watch="{watch_id}"]')).to_have_count(0)
    assert watch_id not in {w["id"] for w in httpx.get(f"{service.url}/v1/watches", timeout=30).json()["watches"]}


def test_the_watches_page_creates_a_schedule_and_shows_its_next_firing(page, service):
    page.goto(f"{service.url}/#/watches")
    form = page.get_by_role("form", name="Create a watch")
    form.get_by_label("on a schedule, every", exact=True).check()
    form.get_by_label(re.compile(r"on a schedule, every \(a duration")).fill("2h")
    # Stacks, not a window: a schedule fires once at creation, and the live job is shared.
    form.get_by_label("take every rank's stacks").check()
    form.get_by_role("button", name="Create watch").press("Enter")

    row = page.locator("#watch-list tbody tr").filter(has_text="every 2.0 h")
    expect(row).to_have_count(1)
    expect(row.locator(".next-at")).to_contain_text("next")
    watch_id = row.get_attribute("data-watch")
    (made,) = [w for w in httpx.get(f"{service.url}/v1/watches", timeout=30).json()["watches"] if w["id"] == watch_id]
    assert (made["spec"]["every_s"], made["spec"]["action"], made["spec"]["target"]) == (7200, "stacks", LIVE_TARGET)
    assert made["next_at"] is not None
    page.get_by_role("button", name=f"Delete watch {watch_id}").press("Enter")
    expect(page.locator(f'#watch-list tr[data-watch="{watch_id}"]')).to_have_count(0)


def test_a_bad_duration_is_refused_in_the_page_and_nothing_is_created(page, service):
    before = len(httpx.get(f"{service.url}/v1/watches", timeout=30).json()["watches"])
    page.goto(f"{service.url}/#/watches")
    form = page.get_by_role("form", name="Create a watch")
    form.get_by_label("holds for").fill("soon")
    form.get_by_role("button", name="Create watch").click()

    expect(page.locator("#status.error")).to_contain_text("for_s: give a duration like 30s, 10m or 1h")
    assert len(httpx.get(f"{service.url}/v1/watches", timeout=30).json()["watches"]) == before


def test_a_profile_page_shows_the_whole_report_and_each_ranks_device_idle_bar(page, service):
    profile_id = profile_from_form(page, service.url, steps=3)
    # The live job runs on CPUs; its summary gets a real 8-rank V100 trace's analysis (PARAM's DLRM).
    gpu = external("param_dlrm_v100_8ranks")

    def with_gpu_summary(body: dict[str, Any]) -> dict[str, Any]:
        body["manifest"]["summary"] = gpu.model_dump(mode="json")
        return body

    _answer_with(page, rf"/v1/profiles/{profile_id}\?wait_s=", with_gpu_summary)
    page.reload()  # the tab is on this profile's page already

    idle = page.locator("#idle")
    expect(idle.locator("tbody tr")).to_have_count(8)
    first = gpu.ranks[0]
    row = idle.locator('tr[data-rank="0"]')
    expect(row).to_contain_text(f"{first.idle.causes[0].label} ({first.idle.causes[0].ms_per_step:.2f} ms)")
    # One segment per cause with time, in the report's colours.
    rects = row.locator("rect")
    expect(rects).to_have_count(1 + len(first.idle.causes))
    for i in range(rects.count()):
        cause = rects.nth(i).get_attribute("data-cause")
        assert rects.nth(i).evaluate("r => getComputedStyle(r).fill") == _rgb(IDLE_COLORS[cause])
    assert "device busy" in idle.locator(".legend").inner_text()
    css = httpx.get(f"{service.url}/console/idle.css", timeout=30)
    assert ".idle-late_rank{fill:" + IDLE_COLORS["late_rank"] in css.text and "script-src 'self'" in css.headers["content-security-policy"]

    # The report is shown whole: the frame is as tall as the report, its step-time chart and top operators in view.
    frame = page.frame_locator("iframe.report")
    frame.get_by_role("heading", name="Top operators").wait_for()
    iframe = page.locator("iframe.report")
    page.wait_for_function("f => f.offsetHeight >= f.contentDocument.documentElement.scrollHeight", arg=iframe.element_handle())
    # Taller than the 70vh (630 px) frame that cut it off after the step-time legend.
    assert iframe.evaluate("f => f.contentDocument.documentElement.scrollHeight") > 900
    assert frame.locator("svg polyline").count() >= 2  # the step-time chart, one line per rank
    # Opening a rank's top operators makes the report taller, and the frame with it.
    before = iframe.evaluate("f => f.offsetHeight")
    frame.locator("details summary").first.click()
    page.wait_for_function(
        "([f, h]) => f.offsetHeight > h && f.offsetHeight >= f.contentDocument.documentElement.scrollHeight",
        arg=[iframe.element_handle(), before],
    )
    shot(page, "profile-idle")
