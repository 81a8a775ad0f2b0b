"""The Python client over the real Serve proxy on 127.0.0.1: waiting, downloads, and its typed errors."""

from __future__ import annotations

import time

import pytest

from orchestrator import ConflictError, ProfileState, ProfilingClient, TargetNotFoundError
from orchestrator.errors import ControllerUnavailableError, UnauthorizedError
from orchestrator.models.profile import Manifest
from tests.support.common import LIVE_TARGET, wait_for
from tests.support.serve_fixtures import TERMINAL_STATES, artifact_problems, why

pytest_plugins = ["tests.support.serve_fixtures"]
pytestmark = pytest.mark.integration


def test_client_over_http_waits_and_downloads_with_verified_checksums(live_job, file_store, service, tmp_path):
    seen: list[ProfileState] = []
    handle = ProfilingClient(service.url).profile(LIVE_TARGET, steps=2)
    manifest = handle.wait(timeout=120, progress=lambda s: seen.append(s.state))
    folder = handle.download(tmp_path / "dl")

    assert manifest.status == ProfileState.DONE, why(manifest)
    assert seen[-1] == ProfileState.DONE and {s.value for s in seen} <= TERMINAL_STATES | {
        "PENDING",
        "SCHEDULED",
        "CAPTURING",
        "COLLECTING",
    }
    assert artifact_problems(folder, manifest) == []
    assert Manifest.model_validate_json((folder / "manifest.json").read_text()) == manifest


def test_client_over_http_sees_the_same_targets_as_in_cluster(live_job, service, client):
    over_http = ProfilingClient(service.url).targets()

    assert [(t.name, t.world_size) for t in over_http] == [(t.name, t.world_size) for t in client.targets()]


def test_client_over_http_raises_conflict_error(live_job, file_store, service):
    http_client = ProfilingClient(service.url)
    handle = http_client.profile(LIVE_TARGET, steps=5)
    with pytest.raises(ConflictError, match="already running"):
        http_client.profile(LIVE_TARGET, steps=1)
    assert (manifest := handle.wait(timeout=120)).status == ProfileState.DONE, why(manifest)


def test_client_over_http_takes_stacks_with_a_post_and_the_bundle_is_stored(live_job, file_store, service, client):
    run = next(t.run for t in client.targets() if t.name == LIVE_TARGET)
    bundle = ProfilingClient(service.url).stacks(LIVE_TARGET, run=run)

    assert bundle.state == ProfileState.DONE and bundle.run == run
    assert ProfilingClient(service.url).get(bundle.id).status().kind == "stacks"


def test_client_over_http_raises_target_not_found(service):
    with pytest.raises(TargetNotFoundError, match="no-such-run"):
        ProfilingClient(service.url).profile("no-such-run", steps=1)


def test_client_with_wrong_token_raises_unauthorized(service):
    with pytest.raises(UnauthorizedError):
        ProfilingClient(service.secure_url, token="nope").targets()


def test_client_with_token_lists_targets(live_job, service):
    targets = ProfilingClient(service.secure_url, token=service.token).targets()

    assert LIVE_TARGET in [t.name for t in targets]


def test_client_reports_a_dead_controller_as_unavailable(service):
    with pytest.raises(ControllerUnavailableError):
        ProfilingClient(service.down_url).targets()


def test_capture_starts_soon_after_the_request(live_job, file_store, service):
    """HTTP-to-capture latency: POST accepted to state CAPTURING (printed; bounded loosely)."""
    http_client = ProfilingClient(service.url)
    posted = time.monotonic()
    handle = http_client.profile(LIVE_TARGET, steps=3)
    capturing = wait_for(
        lambda: (
            ((state := handle.status().state) in (ProfileState.CAPTURING, ProfileState.COLLECTING) or state.is_terminal)
            and time.monotonic()
        ),
        timeout=60,
        interval=0.05,
        what="capture",
    )
    latency = capturing - posted
    print(f"POST accepted -> CAPTURING: {latency:.2f}s")
    assert (manifest := handle.wait(timeout=120)).status == ProfileState.DONE, why(manifest)
    assert latency < 30
