"""Fixtures for the HTTP service tests: one Serve instance on 127.0.0.1 for the session.

Three applications share its proxy (Serve startup is slow on 2 cores):
  /         the service as deployed by default (no token)
  /secure   the same service requiring a bearer token
  /down     a service whose control actor is dead (answers 503)

Test modules load this as a plugin (``pytest_plugins``) so each session
fixture exists once, and import its helpers too: PYTEST_DONT_REWRITE keeps
pytest from warning that it was imported before it could rewrite asserts
(it has none).
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.models.profile import Manifest

TOKEN = "test-token-5f2c-0b7e41"
TERMINAL_STATES = {"DONE", "PARTIAL", "FAILED", "CANCELLED"}


@dataclass(frozen=True)
class Service:
    """URLs of the session's rayprof service instances."""

    url: str
    secure_url: str
    down_url: str
    port: int
    token: str = TOKEN


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def service(ray_cluster: str, client: Any) -> Iterator[Service]:
    """The rayprof Serve apps on a free loopback port; the control actor exists (``client``)."""
    import ray
    from ray import serve

    from actors.controller.actor import Controller
    from orchestrator.config import controller_config
    from orchestrator.service.app import ProfilingService, build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(), name="rayprof", route_prefix="/")
    serve.run(build_app({"token": TOKEN}), name="rayprof-secure", route_prefix="/secure")
    dead = ray.remote(Controller).options(num_cpus=0).remote(controller_config())
    ray.kill(dead, no_restart=True)
    serve.run(ProfilingService.bind(controller=dead), name="rayprof-down", route_prefix="/down")
    base = f"http://127.0.0.1:{port}"
    try:
        yield Service(url=base, secure_url=f"{base}/secure", down_url=f"{base}/down", port=port)
    finally:
        serve.shutdown()


@pytest.fixture
def http(service: Service) -> Iterator[httpx.Client]:
    """A plain HTTP client for the open service."""
    with httpx.Client(base_url=service.url, timeout=60) as c:
        yield c


def wait_terminal(http: httpx.Client, status_url: str, *, timeout: float = 120.0, headers: dict | None = None) -> dict:
    """Long-poll ``status_url`` until the profile ends; returns the last body."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(status_url, params={"wait_s": 5}, headers=headers).json()
        if body["state"] in TERMINAL_STATES:
            return body
    raise AssertionError(f"{status_url} did not end within {timeout}s")


def why(ended: dict | Manifest) -> str:
    """The reasons an ended profile gives, its own and each rank's: the message of a failed assertion."""
    body = ended.model_dump(mode="json") if isinstance(ended, Manifest) else ended
    ranks = "; ".join(f"rank {r['rank']} {r['state']}: {r.get('reason')}" for r in body.get("ranks", []))
    return f"{body.get('state') or body.get('status')}: {body.get('reason')} ({ranks})"


def artifact_problems(folder: Path, manifest: Manifest) -> list[str]:
    """Files of ``manifest`` missing under ``folder`` or differing from its sha256."""
    problems = []
    for artifact in manifest.all_artifacts():
        path = folder / artifact.key
        if not path.is_file():
            problems.append(f"{artifact.key}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != artifact.sha256:
            problems.append(f"{artifact.key}: sha256 differs")
    return problems
