"""Telemetry on a live job: metrics read from Ray's Prometheus endpoint over HTTP, the step-time
history over HTTP, the client and the CLI, and a window's post-window check.

The session cluster is started with a metrics export port (tests/conftest.py);
Ray's metrics agent exports what ``ray.util.metrics`` recorded every few
seconds (``metrics_report_interval_ms``), so each read is retried, bounded.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request

import pytest
import ray

from actors.controller.monitoring import metric_names as m
from orchestrator import ProfilingClient
from orchestrator.settings import DEFAULT_POLL_TIMEOUT_S, POLL_TIMEOUT_S_ENV_VAR, env_float
from tests.support.common import LIVE_TARGET, METRICS_EXPORT_PORT, RAYPROF_CLI, REPO, wait_for

pytest_plugins = ["tests.support.serve_fixtures"]
pytestmark = pytest.mark.integration

# Ray's export period is 10 s by default, and the first export can take a few more.
_EXPORT_WAIT_S = 90.0


def _scrape() -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_EXPORT_PORT}/metrics", timeout=10) as response:
        return response.read().decode()


def _samples(text: str) -> dict[str, list[str]]:
    """Sample lines of rayprof's series, by series name."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"(ray_rayprof_[a-z_]+)[{ ]", line)
        if match:
            found.setdefault(match.group(1), []).append(line)
    return found


def _series(names: set[str]):
    def read():
        samples = _samples(_scrape())
        return samples if names <= samples.keys() else None

    return read


def test_step_time_lag_stalls_and_profiles_are_scraped_from_rays_metrics_endpoint(live_job, client):
    per_rank = {m.exported(d)[0] for d in (m.STEP_TIME, m.STEP_TIME_MEDIAN, m.STEPS_BEHIND, m.SINCE_STEP)}
    per_target = {m.exported(d)[0] for d in (m.STALLED, m.LAGGING, m.RANKS)}
    def every_rank(samples: dict[str, list[str]]) -> dict[str, set[str]]:
        return {
            name: {re.search(r'rank="(\d+)"', line).group(1) for line in samples.get(name, []) if f'target="{LIVE_TARGET}"' in line}
            for name in per_rank
        }

    def both_ranks_exported():
        # Ray exports each label set as it records it: a series can show one rank (or another
        # session target) a period before this target's other label sets.
        samples = _series(per_rank | per_target)()
        if not samples or any(r != {"0", "1"} for r in every_rank(samples).values()):
            return None
        this_target = all(any(f'target="{LIVE_TARGET}"' in line for line in samples[name]) for name in per_target)
        return samples if this_target else None

    samples = wait_for(both_ranks_exported, timeout=_EXPORT_WAIT_S, interval=2.0, what="every rank's series")
    assert all(ranks == {"0", "1"} for ranks in every_rank(samples).values())
    step_time = [line for line in samples[m.exported(m.STEP_TIME)[0]] if f'target="{LIVE_TARGET}"' in line]
    assert all(float(line.rsplit(" ", 1)[1]) > 0 for line in step_time)
    stalled = [line for line in samples[m.exported(m.STALLED)[0]] if f'target="{LIVE_TARGET}"' in line]
    assert stalled and all(line.endswith(" 0.0") or line.endswith(" 0") for line in stalled)

    manifest = client.profile(LIVE_TARGET, steps=2).wait(timeout=180)
    client.stacks(LIVE_TARGET)
    ended = {
        m.exported(m.PROFILES)[0],
        m.exported(m.STACKS)[0],
        m.exported(m.CAPTURED_BYTES)[0],
        m.exported(m.STORED_BYTES)[0],
        *m.exported(m.WINDOW_DURATION),
    }
    def this_profile(line: str) -> bool:
        return f'target="{LIVE_TARGET}"' in line and f'outcome="{manifest.status.value}"' in line and 'trigger="manual"' in line

    def profile_exported():
        # The names can be on the endpoint already (earlier tests' profiles) before this outcome's label set is.
        samples = _series(ended)()
        return samples if samples and any(this_profile(line) for line in samples[m.exported(m.PROFILES)[0]]) else None

    samples = wait_for(profile_exported, timeout=_EXPORT_WAIT_S, interval=2.0, what="profile series")
    profiles = samples[m.exported(m.PROFILES)[0]]
    assert any(this_profile(line) for line in profiles), profiles
    # Bounded labels: no profile id in any series.
    assert not re.search(r"prof-\d{8}", "\n".join(line for lines in samples.values() for line in lines))
    # One sample line per series, for the record (pytest -s shows them).
    for _name, lines in sorted(_samples(_scrape()).items()):
        print(lines[0])


def test_history_over_http_the_client_and_the_cli(live_job, service, http):
    def two_ranks_with_points():
        body = http.get(f"/v1/targets/{LIVE_TARGET}/history").json()
        return body if [r["rank"] for r in body.get("ranks", [])] == [0, 1] and all(len(r["t"]) >= 2 for r in body["ranks"]) else None

    body = wait_for(two_ranks_with_points, timeout=60, what="history of both ranks")
    assert body["resolution_s"] == 1.0 and body["span_s"] == 600.0
    for r in body["ranks"]:
        assert r["step"] == sorted(r["step"]) and r["t"] == sorted(r["t"])
        assert any(v is not None and v > 0 for v in r["step_time_s"])
    assert http.get("/v1/targets/no-such-run/history").status_code == 404
    assert http.get(f"/v1/targets/{LIVE_TARGET}/history", params={"span_s": 10**9}).status_code == 422

    only = ProfilingClient(service.url).history(LIVE_TARGET, span_s=7200, ranks=[1])
    assert [r.rank for r in only.ranks] == [1] and only.resolution_s == 10.0

    shown = subprocess.run(
        [RAYPROF_CLI, "history", LIVE_TARGET, "--span", "10m", "--url", service.url],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{LIVE_TARGET}  run ") and "1s per point" in lines[0]
    assert [line.split()[0] for line in lines[2:]] == ["0", "1"]
    as_json = subprocess.run(
        [RAYPROF_CLI, "history", LIVE_TARGET, "--ranks", "0", "--url", service.url, "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )
    assert [r["rank"] for r in json.loads(as_json.stdout)["ranks"]] == [0]


def test_a_window_gets_a_post_window_check_in_its_status(live_job, client):
    handle = client.profile(LIVE_TARGET, steps=2)
    handle.wait(timeout=180)

    def final():
        check = handle.status().post_window
        return check if check is not None and check.final else None

    # RAYPROF_POST_WINDOW_STEPS (50) steps after the window, heard through 2 s heartbeats.
    check = wait_for(final, timeout=120, interval=2.0, what="a final post-window check")
    assert [r.rank for r in check.ranks] == [0, 1]
    assert check.verdict in ("ok", "slower")  # a shared CI machine may really run slower for a while
    assert all(r.before_s and r.after_s and r.ratio for r in check.ranks), check
    names = {m.exported(m.POST_WINDOW_RATIO)[0], m.exported(m.POST_WINDOW_CHECKS)[0]}
    samples = wait_for(_series(names), timeout=_EXPORT_WAIT_S, interval=2.0, what="post-window series")
    assert any(f'verdict="{check.verdict}"' in line for line in samples[m.exported(m.POST_WINDOW_CHECKS)[0]])
    for name in sorted(names):
        print(samples[name][0])


def test_an_ended_runs_gauge_series_leave_rays_metrics_endpoint(client):
    # Ray 2.43's metrics agent exports a gauge's label set for as long as the process that set it lives:
    # the controller's gauges live in a recorder process it replaces, so an ended run's series go (on
    # 2.60 as on 2.43) instead of piling up for the controller's life.
    from benchmarks.sim_host import SimHost

    target = "gauges-ended"
    names = {m.exported(d)[0] for d in (m.STEP_TIME, m.STEPS_BEHIND, m.SINCE_STEP, m.STALLED, m.RANKS)}

    def of_target() -> list[str]:
        samples = _samples(_scrape())
        return [line for name in names for line in samples.get(name, []) if f'target="{target}"' in line]

    host = SimHost.remote(target, [0, 1], 2, 0, 0.1, 0, env_float(POLL_TIMEOUT_S_ENV_VAR, DEFAULT_POLL_TIMEOUT_S))
    try:
        ray.get(host.start.remote(0.5), timeout=120)
        wait_for(lambda: len(of_target()) >= 5, timeout=_EXPORT_WAIT_S, interval=2.0, what="the run's series")
    finally:
        ray.get(host.stop.remote(), timeout=30)
        ray.kill(host)
    # The ranks expire (poll timeout + grace), their gauges are held RAYPROF_METRICS_ENDED_KEPT_S (5 s
    # here), the recorder is replaced within 4 of those, and Ray 2.43 forgets the old process's label
    # sets RAY_WORKER_TIMEOUT_S after its last report (30 s in tests/conftest.py; Ray's default 120 s).
    wait_for(lambda: not of_target(), timeout=300, interval=5.0, what="the run's series to leave")
