"""The HTTP API through the real Serve proxy on 127.0.0.1: status codes, JSON bodies, headers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from orchestrator import (
    ProfilingClient,
)
from orchestrator.build import build_id
from orchestrator.models.profile import Manifest
from tests.support.common import LIVE_TARGET, wait_for
from tests.support.serve_fixtures import (
    artifact_problems,
    wait_terminal,
    why,
)

pytest_plugins = ["tests.support.serve_fixtures"]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def finished(live_job, service, tmp_path_factory) -> dict:
    """One profile run over HTTP to the end: the POST response, the final status, the store."""
    root = tmp_path_factory.mktemp("http-store")
    ProfilingClient.in_cluster(storage=str(root))
    with httpx.Client(base_url=service.url, timeout=60) as http:
        created = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 3, "profile_memory": True})
        final = wait_terminal(http, created.json()["status_url"])
    return {"created": created, "final": final, "root": root}


# ---- the happy path ----------------------------------------------------------


def test_post_answers_202_with_id_and_status_url(finished, service):
    created = finished["created"]
    body = created.json()

    assert created.status_code == 202
    assert body["status_url"] == f"{service.url}/v1/profiles/{body['id']}"
    assert created.headers["location"] == body["status_url"]
    assert body["target"] == LIVE_TARGET and body["request"]["steps"] == 3


def test_finished_status_inlines_the_stored_manifest(finished, http):
    final = finished["final"]
    manifest = http.get(f"/v1/profiles/{final['id']}/manifest")

    assert final["state"] == "DONE", why(final)
    assert [r["state"] for r in final["ranks"]] == ["DONE", "DONE"]
    assert manifest.status_code == 200
    assert final["manifest"] == manifest.json()


def test_manifest_artifacts_are_in_storage_with_matching_checksums(finished):
    manifest = Manifest.model_validate(finished["final"]["manifest"])
    folder = Path(finished["root"]) / LIVE_TARGET / manifest.profile_id

    assert {a.kind for a in manifest.all_artifacts()} >= {"trace", "memory_timeline", "op_table"}
    assert artifact_problems(folder, manifest) == []


def test_status_shows_per_rank_progress_while_running(live_job, file_store, http):
    created = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 5}).json()

    running = wait_for(
        lambda: (b := http.get(created["status_url"]).json())["state"] != "PENDING" and b,
        timeout=60,
        interval=0.05,
        what="scheduling",
    )
    assert running["start_step"] is not None
    assert [r["rank"] for r in running["ranks"]] == [0, 1]
    assert {r["state"] for r in running["ranks"]} <= {"WAITING", "ARMED", "CAPTURING", "UPLOADING", "DONE"}
    assert (ended := wait_terminal(http, created["status_url"]))["state"] == "DONE", why(ended)


def test_list_filters_by_target_and_state(finished, http):
    profile_id = finished["final"]["id"]

    done = http.get("/v1/profiles", params={"target": LIVE_TARGET, "state": "DONE"}).json()["profiles"]
    other = http.get("/v1/profiles", params={"target": "no-such-run"}).json()["profiles"]
    failed = http.get("/v1/profiles", params={"target": LIVE_TARGET, "state": "FAILED"}).json()["profiles"]

    assert profile_id in [p["id"] for p in done]
    assert {(p["target"], p["state"]) for p in done} == {(LIVE_TARGET, "DONE")}
    assert other == []
    assert profile_id not in [p["id"] for p in failed]


def test_report_is_served_from_storage(finished, http):
    # Reports are read from the configured storage: the one this module's profile went to.
    ProfilingClient.in_cluster(storage=str(finished["root"]))
    report = http.get(f"/v1/profiles/{finished['final']['id']}/report")
    stored = Path(finished["root"]) / LIVE_TARGET / finished["final"]["id"] / "report.html"

    assert report.status_code == 200
    assert report.headers["content-type"].startswith("text/html")
    assert report.text == stored.read_text()


def test_delete_cancels_and_the_profile_has_no_report(live_job, file_store, http):
    created = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 40}).json()
    cancelled = http.delete(f"/v1/profiles/{created['id']}")
    final = wait_terminal(http, created["status_url"])
    report = http.get(f"/v1/profiles/{created['id']}/report")

    assert cancelled.status_code == 200
    assert final["state"] == "CANCELLED"
    assert final["manifest"]["status"] == "CANCELLED"
    assert report.status_code == 404
    assert report.json() == {
        "error": "not_found",
        "detail": f"profile {created['id']} has no report: its manifest lists no artifact of kind 'report'",
    }


def test_a_memory_snapshot_of_a_cpu_job_fails_each_rank_with_why_and_training_goes_on(live_job, file_store, http):
    created = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 2, "memory_snapshot": True}).json()
    final = wait_terminal(http, created["status_url"])
    again = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 2}).json()
    after = wait_terminal(http, again["status_url"])

    assert final["state"] == "FAILED", why(final)
    assert [r["reason"] for r in final["ranks"]] == [
        "profiler error: RuntimeError: memory_snapshot asked for, but this worker has no CUDA device "
        "(a memory snapshot records the CUDA caching allocator)"
    ] * 2
    assert after["state"] == "DONE", why(after)


def test_targets_lists_the_live_run_with_its_ranks(live_job, http):
    targets = http.get("/v1/targets").json()["targets"]

    (live,) = [t for t in targets if t["name"] == LIVE_TARGET]
    assert live["world_size"] == 2
    assert [r["info"]["world_rank"] for r in live["ranks"]] == [0, 1]


def test_healthz_and_docs_are_served(service, http):
    # The service and the control actor it created run one build: the one this test imports.
    assert http.get("/healthz").json() == {"status": "ok", "build": build_id()}
    assert http.get("/docs").status_code == 200
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/v1/profiles", "/v1/profiles/{profile_id}", "/v1/profiles/{profile_id}/report", "/v1/targets"} <= set(
        paths
    )


# ---- errors: status and JSON body ------------------------------------------


def test_missing_token_is_401(service):
    r = httpx.get(f"{service.secure_url}/v1/targets")

    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized", "detail": "missing or wrong bearer token"}
    assert r.headers["www-authenticate"] == "Bearer"


def test_wrong_token_is_401(service):
    r = httpx.get(f"{service.secure_url}/v1/targets", headers={"Authorization": "Bearer not-the-token"})

    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"


def test_right_token_is_accepted_and_healthz_needs_none(service):
    authed = httpx.get(f"{service.secure_url}/v1/targets", headers={"Authorization": f"Bearer {service.token}"})
    health = httpx.get(f"{service.secure_url}/healthz")

    assert authed.status_code == 200
    assert health.status_code == 200


def test_unknown_target_is_404(http):
    r = http.post("/v1/profiles", json={"target": "no-such-run", "steps": 1})

    assert r.status_code == 404
    assert r.json()["error"] == "target_not_found"
    assert "no-such-run" in r.json()["detail"]


def test_unknown_profile_id_is_404(http):
    r = http.get("/v1/profiles/prof-unknown")

    assert r.status_code == 404
    assert r.json() == {"error": "profile_not_found", "detail": "no profile with id 'prof-unknown'"}


def test_second_window_on_a_target_is_409_unless_queued(live_job, file_store, http):
    first = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 5}).json()
    conflict = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 1})
    queued = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 1, "queue": True})

    assert conflict.status_code == 409
    assert conflict.json()["error"] == "conflict"
    assert first["id"] in conflict.json()["detail"]
    assert queued.status_code == 202
    assert (ended := wait_terminal(http, first["status_url"]))["state"] == "DONE", why(ended)
    assert (ended := wait_terminal(http, queued.json()["status_url"]))["state"] == "DONE", why(ended)


def test_steps_over_the_maximum_are_400(http):
    r = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 10_000})

    assert r.status_code == 400
    assert r.json()["error"] == "invalid_request"
    assert "over the maximum" in r.json()["detail"]


def test_body_over_64_kib_is_413(http):
    r = http.post(
        "/v1/profiles", content=b"{" + b" " * (65 * 1024) + b"}", headers={"content-type": "application/json"}
    )

    assert r.status_code == 413
    assert r.json()["error"] == "body_too_large"


def test_streamed_body_over_64_kib_is_413(http):
    r = http.post(
        "/v1/profiles", content=(b" " * 1024 for _ in range(70)), headers={"content-type": "application/json"}
    )

    assert r.status_code == 413
    assert r.json()["error"] == "body_too_large"


def test_malformed_json_is_422(http):
    r = http.post("/v1/profiles", content=b'{"target": "x", "steps": ', headers={"content-type": "application/json"})

    assert r.status_code == 422
    assert r.json()["error"] == "validation_error"
    assert "JSON" in r.json()["detail"]


def test_unknown_field_is_422(http):
    r = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 1, "bucket": "s3://elsewhere"})

    assert r.status_code == 422
    assert r.json() == {
        "error": "validation_error",
        "detail": "body.bucket: Extra inputs are not permitted (a field this service does not know: misspelt, or an "
        "option of a newer rayprof than the service's)",
    }


@pytest.mark.parametrize("target", ["../x", "..", "a/b", ".hidden", "x..y"])
def test_target_that_could_escape_storage_is_422(http, target):
    r = http.post("/v1/profiles", json={"target": target, "steps": 1})

    assert r.status_code == 422
    assert r.json()["error"] == "validation_error"
    assert r.json()["detail"].startswith("body.target:")


def test_profile_id_that_could_escape_storage_is_422(http):
    r = http.get("/v1/profiles/%2E%2E")

    assert r.status_code == 422
    assert r.json()["detail"].startswith("path.profile_id:")


def test_unknown_state_filter_is_422(http):
    r = http.get("/v1/profiles", params={"state": "RUNNING"})

    assert r.status_code == 422
    assert r.json()["detail"].startswith("query.state:")


def test_dead_controller_is_503(service):
    r = httpx.get(f"{service.down_url}/v1/targets", timeout=60)

    assert r.status_code == 503
    assert r.json()["error"] == "controller_unavailable"


# ---- hardening: empty rank lists, report headers, Host allow-list, 500 bodies ------


def test_empty_rank_list_is_422(http):
    r = http.post("/v1/profiles", json={"target": LIVE_TARGET, "steps": 1, "ranks": []})

    assert r.status_code == 422
    assert r.json()["detail"].startswith("body.ranks:")


def test_report_is_served_under_a_strict_content_security_policy(finished, http):
    ProfilingClient.in_cluster(storage=str(finished["root"]))
    report = http.get(f"/v1/profiles/{finished['final']['id']}/report")

    csp = report.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src" not in csp
    assert report.headers["x-content-type-options"] == "nosniff"


def test_stacks_are_taken_only_by_a_post_that_no_other_sites_page_sent(live_job, http):
    got = http.get(f"/v1/targets/{LIVE_TARGET}/stacks", params={"native": "true"})
    foreign = http.post(f"/v1/targets/{LIVE_TARGET}/stacks", headers={"Origin": "https://evil.example"})

    assert got.status_code == 405
    assert foreign.status_code == 403 and foreign.json()["error"] == "forbidden"


def test_request_under_a_foreign_host_name_is_refused_without_a_token(service):
    rebound = httpx.get(f"{service.url}/v1/targets", headers={"Host": "attacker.example"})
    local = httpx.get(f"{service.url}/v1/targets")

    assert rebound.status_code == 400
    assert "not allowed" in rebound.json()["detail"]
    assert local.status_code == 200


def test_storage_root_is_served_for_downloads(file_store, http):
    assert http.get("/v1/storage").json() == {"uri": Path(file_store.root).resolve().as_uri()}


class _BrokenController:
    """A control actor of this build whose calls fail the way a library error would: with an address in the text."""

    async def ping(self) -> str:
        return build_id()

    async def targets(self) -> list:
        raise RuntimeError("connect to 10.9.8.7:9000 refused")


@pytest.fixture(scope="module")
def broken_url(service):
    import ray
    from ray import serve

    from orchestrator.service.app import ProfilingService

    controller = ray.remote(_BrokenController).options(num_cpus=0).remote()
    serve.run(ProfilingService.bind(controller=controller), name="rayprof-broken", route_prefix="/broken")
    try:
        yield f"{service.url}/broken"
    finally:
        serve.delete("rayprof-broken")
        ray.kill(controller)


def test_unexpected_error_is_a_generic_500_with_an_error_id(broken_url):
    r = httpx.get(f"{broken_url}/v1/targets", timeout=60)

    body = r.json()
    assert r.status_code == 500
    assert body["error"] == "internal_error" and body["error_id"] in body["detail"]
    assert "10.9.8.7" not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text

