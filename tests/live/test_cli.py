"""The ``rayprof`` console script, run as users run it: a subprocess."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.analysis.finding_base import verdict
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Manifest
from orchestrator.settings import TOKEN_ENV_VAR
from tests.support.common import LIVE_TARGET, RAYPROF_CLI, REPO
from tests.support.serve_fixtures import artifact_problems, free_port

pytest_plugins = ["tests.support.serve_fixtures"]

RAYPROF = RAYPROF_CLI
TRACES = REPO / "tests" / "data" / "traces"


def rayprof(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the console script; output captured as text."""
    return subprocess.run([RAYPROF, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)


def rayprof_env(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the console script with ``env`` added to this process's environment."""
    return subprocess.run(
        [RAYPROF, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False,
        env={**os.environ, **env},
    )


# ---- no cluster needed -------------------------------------------------------


def test_missing_steps_is_a_usage_error():
    result = rayprof("profile", "my-run")

    assert result.returncode == 2
    assert "--steps" in result.stderr


def test_unreachable_service_exits_1_with_a_json_error():
    result = rayprof("targets", "--url", f"http://127.0.0.1:{free_port()}", "--json")

    assert result.returncode == 1
    assert json.loads(result.stdout)["error"] == "controller_unavailable"


def test_invalid_target_name_exits_2_before_any_request():
    result = rayprof("profile", "../etc", "--steps", "1", "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "invalid_request" in result.stderr


def test_empty_rank_list_exits_2_before_any_request():
    result = rayprof("profile", "my-run", "--steps", "1", "--ranks", ",", "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "--ranks names no rank" in result.stderr


def test_invalid_profile_id_exits_2_before_any_request():
    result = rayprof("download", "../../etc", "/tmp", "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "invalid profile id" in result.stderr


def test_empty_token_variable_is_an_error_not_no_auth():
    result = rayprof_env({TOKEN_ENV_VAR: ""}, "targets", "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "RAYPROF_TOKEN is empty" in result.stderr


def test_empty_token_file_is_an_error(tmp_path):
    (tmp_path / "token").write_text("\n")

    result = rayprof("targets", "--token-file", str(tmp_path / "token"), "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "is empty" in result.stderr


def test_a_token_under_16_characters_exits_2_before_any_request():
    result = rayprof_env({TOKEN_ENV_VAR: "short-token"}, "targets", "--url", f"http://127.0.0.1:{free_port()}")

    assert result.returncode == 2
    assert "RAYPROF_TOKEN is 11 characters; a token needs at least 16" in result.stderr


def test_serve_on_a_public_address_without_a_token_is_refused():
    # --address names no cluster: should the refusal be missing, nothing gets deployed anywhere.
    result = rayprof("serve", "--host", "0.0.0.0", "--address", f"127.0.0.1:{free_port()}", timeout=120)

    assert result.returncode == 2
    assert "would listen on every interface with no token" in result.stderr
    assert "--insecure" in result.stderr


def test_analyze_prints_no_terminal_control_characters_from_traces(tmp_path):
    folder = tmp_path / "hostile"
    shutil.copytree(TRACES / "healthy", folder)
    path = next((folder / "traces").glob("rank0.*"))
    trace = json.loads(gzip.decompress(path.read_bytes()))
    trace["host_name"] = "vm\x1b]0;pwned\x07\x1b[2J\u202e"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))

    result = rayprof("analyze", str(folder))

    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "vm\\x1b]0;pwned\\x07" in result.stdout


def test_analyze_writes_a_report_and_prints_the_findings(tmp_path):
    folder = tmp_path / "straggler"
    shutil.copytree(TRACES / "straggler", folder)

    result = rayprof("analyze", str(folder))

    assert result.returncode == 0, result.stderr
    assert "straggler" in result.stdout.lower()
    assert "rank" in result.stdout and f"report: {folder / 'report.html'}" in result.stdout
    assert (folder / "report.html").read_text().startswith("<!doctype html>")


def test_analyze_never_writes_through_links_planted_in_the_folder(tmp_path):
    folder = tmp_path / "shared"
    shutil.copytree(TRACES / "straggler", folder)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (folder / ".report.html.tmp").symlink_to(victim)
    (folder / "report.html").symlink_to(victim)

    result = rayprof("analyze", str(folder))

    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "keep me"
    report = folder / "report.html"
    assert not report.is_symlink() and report.read_text().startswith("<!doctype html>")


def test_analyze_json_is_machine_readable(tmp_path):
    folder = tmp_path / "healthy"
    shutil.copytree(TRACES / "healthy", folder)

    out = json.loads(rayprof("analyze", str(folder), "--json").stdout)

    assert [r["rank"] for r in out["summary"]["ranks"]] == [0, 1]
    assert out["report"] == str(folder / "report.html")


def test_analyze_writes_the_merged_trace_and_reports_each_ranks_alignment(tmp_path):
    # Issue 24 item 5: the alignment of any folder can be checked without a cluster.
    folder = tmp_path / "healthy"
    shutil.copytree(TRACES / "healthy", folder)

    out = json.loads(rayprof("analyze", str(folder), "--json").stdout)

    assert (folder / "merged.trace.json.gz").is_file()
    assert out["merge"]["ranks"] == [0, 1]
    assert [a["rank"] for a in out["merge"]["alignment"]] == [0, 1]
    assert all("shift_us" in a and "residual_us" in a for a in out["merge"]["alignment"])


def test_analyze_of_a_folder_without_traces_exits_1(tmp_path):
    result = rayprof("analyze", str(tmp_path))

    assert result.returncode == 1
    assert "no usable traces" in result.stderr


# ---- against the session's service ---------------------------------------------


@pytest.mark.integration
def test_profile_wait_download_leaves_files_with_matching_checksums(live_job, file_store, service, tmp_path):
    result = rayprof(
        "profile",
        LIVE_TARGET,
        "--steps",
        "2",
        "--profile-memory",
        "--wait",
        "--download",
        str(tmp_path),
        "--url",
        service.url,
        "--json",
    )

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    manifest = Manifest.model_validate(out["manifest"])
    folder = Path(out["downloaded_to"])
    assert folder == tmp_path / manifest.profile_id
    assert artifact_problems(folder, manifest) == []
    assert Manifest.model_validate_json((folder / "manifest.json").read_text()) == manifest
    # Progress per rank went to stderr while it waited.
    assert "rank0 DONE 2/2 steps" in result.stderr and "rank1 DONE 2/2 steps" in result.stderr


@pytest.mark.integration
def test_targets_lists_the_live_run(live_job, service):
    result = rayprof("targets", "--url", service.url)

    assert result.returncode == 0, result.stderr
    assert LIVE_TARGET in result.stdout and "2/2" in result.stdout


@pytest.mark.integration
def test_status_list_and_cancel_of_a_profile(live_job, file_store, service):
    submitted = rayprof("profile", LIVE_TARGET, "--steps", "40", "--url", service.url)
    profile_id = submitted.stdout.strip()
    cancelled = rayprof("cancel", profile_id, "--url", service.url, "--json")
    listed = rayprof("list", "--target", LIVE_TARGET, "--url", service.url, "--json")
    file_store.client.get(profile_id).wait(timeout=120)
    status = rayprof("status", profile_id, "--url", service.url)

    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(cancelled.stdout)["id"] == profile_id
    assert profile_id in [p["id"] for p in json.loads(listed.stdout)["profiles"]]
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].startswith(f"{profile_id}  target {LIVE_TARGET}  CANCELLED")


@pytest.mark.integration
def test_waited_profile_that_gets_cancelled_exits_1(live_job, file_store, service):
    waiting = subprocess.Popen(
        [RAYPROF, "profile", LIVE_TARGET, "--steps", "40", "--wait", "--url", service.url, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert waiting.stderr is not None
        submitted = waiting.stderr.readline()  # "submitted <id> on <target>"
        cancelled = rayprof("cancel", submitted.split()[1], "--url", service.url)
        out, _ = waiting.communicate(timeout=120)
    finally:
        waiting.kill()

    assert cancelled.returncode == 0, cancelled.stderr
    assert waiting.returncode == 1
    assert json.loads(out)["manifest"]["status"] == "CANCELLED"


@pytest.mark.integration
def test_unknown_target_exits_2(live_job, service):
    result = rayprof("profile", "no-such-run", "--steps", "1", "--url", service.url)

    assert result.returncode == 2
    assert "target_not_found" in result.stderr


@pytest.mark.integration
def test_wrong_token_exits_2(service):
    result = rayprof("targets", "--url", service.secure_url, "--token", "not-the-service-token")

    assert result.returncode == 2
    assert "unauthorized" in result.stderr


@pytest.mark.integration
def test_report_of_a_profile_id_downloads_it_with_its_report(live_job, file_store, service, tmp_path):
    profile_id = rayprof("profile", LIVE_TARGET, "--steps", "2", "--wait", "--url", service.url, "--json")
    manifest = Manifest.model_validate(json.loads(profile_id.stdout)["manifest"])

    result = rayprof("report", manifest.profile_id, "--dest", str(tmp_path), "--url", service.url)

    assert result.returncode == 0, result.stderr
    report = tmp_path / manifest.profile_id / "report.html"
    assert f"report: {report}" in result.stdout
    assert artifact_problems(tmp_path / manifest.profile_id, manifest) == []


@pytest.mark.integration
def test_download_of_a_finished_profile_verifies_checksums(live_job, file_store, service, tmp_path):
    waited = rayprof("profile", LIVE_TARGET, "--steps", "1", "--wait", "--url", service.url, "--json")
    manifest = Manifest.model_validate(json.loads(waited.stdout)["manifest"])

    result = rayprof("download", manifest.profile_id, str(tmp_path), "--url", service.url)

    assert result.returncode == 0, result.stderr
    assert f"downloaded to {tmp_path / manifest.profile_id} (sha256 verified)" in result.stdout
    assert artifact_problems(tmp_path / manifest.profile_id, manifest) == []


@pytest.mark.integration
def test_in_cluster_profile_talks_to_the_control_actor(live_job, ray_cluster, file_store):
    result = rayprof("profile", LIVE_TARGET, "--steps", "1", "--wait", "--in-cluster", "--address", ray_cluster)

    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    assert re.fullmatch(rf"prof-\S+  target {LIVE_TARGET}  DONE", header), header


@pytest.mark.integration
def test_a_waited_profile_ends_with_its_verdict_and_the_command_for_the_rest(live_job, file_store, service):
    result = rayprof("profile", LIVE_TARGET, "--steps", "2", "--wait", "--url", service.url)

    assert result.returncode == 0, result.stderr
    profile_id = result.stdout.split()[0]
    manifest = file_store.client.get(profile_id).manifest()
    assert isinstance(manifest.summary, Summary)
    assert result.stdout.splitlines()[-2:] == [
        f"verdict: {verdict(manifest.summary)}", f"findings, phases per rank: rayprof report {profile_id}"
    ]


@pytest.mark.integration
def test_serve_deploys_onto_the_running_cluster_and_returns(live_job, ray_cluster, service):
    # Redeploys the session's open app in place (same port, same settings).
    result = rayprof("serve", "--address", ray_cluster, "--port", str(service.port), "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["url"] == service.url
    assert rayprof("targets", "--url", service.url, "--json").returncode == 0


@pytest.mark.integration
def test_token_file_authenticates_against_the_secure_service(service, tmp_path):
    (tmp_path / "token").write_text(service.token + "\n")

    from_flag = rayprof("targets", "--url", service.secure_url, "--token-file", str(tmp_path / "token"))
    from_env = rayprof_env({"RAYPROF_TOKEN_FILE": str(tmp_path / "token")}, "targets", "--url", service.secure_url)

    assert from_flag.returncode == 0, from_flag.stderr
    assert from_env.returncode == 0, from_env.stderr
