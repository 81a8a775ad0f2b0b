"""docs/deploy.md's token-auth sequence, run as written: `ray start` → `rayprof serve` → `ray job submit` → `rayprof targets`.

The commands are read out of docs/deploy.md's "Running on a Ray cluster: token auth"
block, so the document and the test cannot drift apart. They run in a fresh
shell's environment with a fresh HOME: `ray get-auth-token --generate` makes
the token there, so the cluster requires it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.own_cluster import REPO, ray_stop, require_no_other_cluster, shell_env

pytest_plugins = ["tests.support.own_cluster"]
pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]

DOC = REPO / "docs" / "deploy.md"
SECTION = "## Running on a Ray cluster: token auth"
# What the document's commands use: the GCS port it names, and Ray's and rayprof's defaults.
PORTS = {"GCS (--port)": 6390, "rayprof serve": 8000, "Ray dashboard": 8265, "Ray client server": 10001}
GCS_ADDRESS = "127.0.0.1:6390"
TARGET = "my-run"
TARGETS_TIMEOUT_S = 240


def readme_commands() -> list[str]:
    """The commands of the token-auth block, continuation lines joined, comment lines left out."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC.name} has no section {SECTION!r}"
    block = re.search(r"```bash\n(.*?)```", text.split(SECTION, 1)[1], re.S)
    assert block, f"{DOC.name}'s {SECTION!r} has no bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def run(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class ReadmeCluster:
    env: dict[str, str]
    commands: dict[str, str]  # the first word after any VAR=value prefix, and the subcommand
    submitted: str


def _key(command: str) -> str:
    words = [w for w in command.split() if not re.match(r"^[A-Z_]+=", w)]
    return " ".join(words[:2])


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory) -> Iterator[ReadmeCluster]:
    """The block up to `rayprof targets`; its `ray stop` afterwards."""
    require_no_other_cluster()
    busy = [f"{what} {port}" for what, port in PORTS.items() if _listening(port)]
    assert not busy, f"The token-auth commands need these ports on 127.0.0.1, but they are taken: {busy}"
    commands = readme_commands()
    keys = [_key(c) for c in commands]
    assert keys == ["ray get-auth-token", "ray start", "rayprof serve", "ray job", "rayprof targets", "ray stop"], (
        commands
    )
    env = shell_env(HOME=str(tmp_path_factory.mktemp("home")))
    submitted = ""
    try:
        for command in commands[:4]:
            result = run(command, env, timeout=300)
            assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
            submitted += result.stdout + result.stderr
        yield ReadmeCluster(env, dict(zip(keys, commands)), submitted)
    finally:
        run(commands[-1], env, timeout=120)
        ray_stop(env)


def test_job_submit_without_ray_auth_mode_is_refused(readme_cluster):
    command = readme_cluster.commands["ray job"].replace("RAY_AUTH_MODE=token ", "")
    result = run(command, readme_cluster.env, timeout=120)

    assert result.returncode != 0
    assert "AuthenticationError" in result.stderr


def test_rayprof_serve_with_a_hand_set_ray_address_says_what_to_fix(readme_cluster):
    env = dict(readme_cluster.env, RAY_ADDRESS=GCS_ADDRESS)
    result = run(readme_cluster.commands["rayprof serve"], env, timeout=120)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the Ray cluster at {GCS_ADDRESS} refused this process" in result.stderr
    assert "export RAY_AUTH_MODE=token" in result.stderr and "unset RAY_ADDRESS" in result.stderr
    # Asked once instead of ray.init()'s 20 s of retries (each retry logs its refusal; the clock is not asked).
    assert result.stderr.count("InvalidAuthToken") <= 1 and "Failed to connect" not in result.stderr


def test_rayprof_serve_with_ray_address_and_ray_auth_mode_token_deploys(readme_cluster):
    env = dict(readme_cluster.env, RAY_ADDRESS=GCS_ADDRESS, RAY_AUTH_MODE="token")
    result = run(readme_cluster.commands["rayprof serve"], env, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "rayprof service: http://127.0.0.1:8000" in result.stdout


def test_readme_sequence_lists_the_submitted_job_in_rayprof_targets(readme_cluster):
    command = readme_cluster.commands["rayprof targets"]
    deadline = time.monotonic() + TARGETS_TIMEOUT_S
    result = run(command, readme_cluster.env, timeout=60)
    while not re.search(rf"^{TARGET}\s+2/2\s", result.stdout, re.M) and time.monotonic() < deadline:
        time.sleep(3)
        result = run(command, readme_cluster.env, timeout=60)
    print(f"$ {command}\n{result.stdout}")

    assert result.returncode == 0, result.stderr
    assert re.search(rf"^{TARGET}\s+2/2\s", result.stdout, re.M), _job_logs(readme_cluster)


def _job_logs(cluster: ReadmeCluster) -> str:
    """The submitted job's log, for a failure message."""
    found = re.search(r"raysubmit_\w+", cluster.submitted)
    if not found:
        return f"no submission id in:\n{cluster.submitted[-2000:]}"
    logs = run(f"RAY_AUTH_MODE=token ray job logs {found.group(0)}", cluster.env, timeout=60)
    return f"{TARGET} never showed 2/2 ranks; job log:\n{logs.stdout[-3000:]}{logs.stderr[-1000:]}"


def test_the_job_submitted_with_only_the_setup_hook_is_profiled_with_its_submission_id(readme_cluster):
    # Runs after the targets test: the job is registered by then.
    found = re.search(r"raysubmit_\w+", readme_cluster.submitted)
    assert found, readme_cluster.submitted[-2000:]
    result = run(f"rayprof profile {TARGET} --steps 2 --wait --json", readme_cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    manifest = json.loads(result.stdout)["manifest"]
    assert manifest["status"] == "DONE"
    assert manifest["cluster"]["submission_ids"] == [found.group(0)]

