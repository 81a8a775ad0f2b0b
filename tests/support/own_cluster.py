"""Tests that start their own Ray cluster with `ray start` (marked ``own_cluster``) run before every other test.

tests/conftest.py's ``ray_cluster`` starts a local cluster inside the pytest
process the first time a test needs it and keeps it to the end of the session.
A cluster started with `ray start` ends with `ray stop`, which stops every Ray
process on the machine, that one included. So these tests run first, while no
other cluster is up (tests/conftest.py orders them), and refuse to run beside one.

Test modules load this as a plugin (``pytest_plugins = ["tests.support.own_cluster"]``)
and import its helpers too: PYTEST_DONT_REWRITE keeps pytest from warning that
it was imported before it could rewrite asserts (it has none).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# `ray`, `rayprof` and `python` of the interpreter running the tests come first on PATH.
VENV_BIN = str(Path(sys.executable).parent)
# What a fresh shell would not have: the session's own Ray settings, and conftest's
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps any node from joining a cluster (on Linux too).
_NOT_IN_A_FRESH_SHELL = (
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
)


def require_no_other_cluster() -> None:
    """Fail (never stop someone's cluster) when another Ray cluster is up on this machine."""
    import ray

    from orchestrator.ray_compat import running_gcs_addresses

    if ray.is_initialized():
        pytest.fail("this pytest process is already connected to a Ray cluster; own_cluster tests must run first")
    running = running_gcs_addresses()
    if running:
        pytest.fail(
            f"another Ray cluster runs on this machine ({', '.join(sorted(running))}); these tests end with "
            "`ray stop`, which would stop it: run them alone, under flock /tmp/rayprof-ray.lock"
        )


def shell_env(**extra: str) -> dict[str, str]:
    """A fresh shell's environment with this checkout installed, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_IN_A_FRESH_SHELL}
    env["PATH"] = os.pathsep.join([VENV_BIN, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


def ray_stop(env: dict[str, str]) -> None:
    """`ray stop`: every Ray process on the machine, which require_no_other_cluster made ours."""
    subprocess.run(["ray", "stop"], env=env, capture_output=True, timeout=120, check=False)
