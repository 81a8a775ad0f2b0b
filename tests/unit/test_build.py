"""A control actor outlives upgrades (it is detached): a build id tells its code from its caller's, and the
service refuses a controller of another build with what to do. The real service app in process
(tests/support/inprocess_service.py); the replacement itself runs on a live cluster
(tests/live/test_faults.py::test_a_controller_of_an_older_release_is_refused_then_replaced)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.build import BEFORE_BUILD_IDS, build_id, build_mismatch, release, source_digest
from tests.support.fake_agents import make_controller, run
from tests.support.inprocess_service import service_client

BODY = {"target": "run", "steps": 3}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_same_code_installed_in_two_places_has_one_digest(tmp_path: Path) -> None:
    a = _tree(tmp_path / "site-a" / "orchestrator", {"__init__.py": "", "x/y.py": "A = 1\n"})
    b = tmp_path / "site-b" / "orchestrator"
    shutil.copytree(a, b)
    (b / "x" / "y.cpython-311.pyc").write_bytes(b"compiled")  # byte code is no code of its own
    assert source_digest([a]) == source_digest([b])


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "x" / "y.py").write_text("A = 2\n"),
        lambda root: (root / "x" / "y.py").rename(root / "x" / "z.py"),
        lambda root: (root / "new.py").write_text(""),
    ],
    ids=["a byte", "a rename", "a new file"],
)
def test_any_change_to_the_code_changes_the_digest(tmp_path: Path, change) -> None:
    root = _tree(tmp_path / "orchestrator", {"__init__.py": "", "x/y.py": "A = 1\n"})
    before = source_digest([root])
    change(root)
    assert source_digest([root]) != before


def test_the_build_id_is_the_release_and_the_digest_of_this_code() -> None:
    assert build_id().startswith(f"{release()}+")
    assert build_id() == build_id()
    assert build_mismatch(build_id()) is None


def test_a_controller_of_a_release_before_build_ids_is_refused_with_how_to_replace_it() -> None:
    refusal = build_mismatch(BEFORE_BUILD_IDS)
    assert refusal is not None and refusal.code == "controller_build_mismatch" and refusal.http_status == 503
    assert "runs a rayprof release from before build ids" in refusal.message
    assert f"this is build {build_id()}" in refusal.message
    assert "rayprof serve --replace-controller" in refusal.message and "replace_controller=True" in refusal.message


def test_a_controller_answers_ping_with_its_build(home) -> None:
    assert run(make_controller(home).ping()) == build_id()


class _OlderRelease:
    """A control actor as every release before build ids answers: ``ping`` says "ok" (reached as through a Ray
    handle, ``handle.method.remote(...)``); it has no other method this test reaches."""

    class _Ping:
        async def remote(self) -> str:
            return BEFORE_BUILD_IDS

    ping = _Ping()


def test_the_service_refuses_a_controller_of_another_build_on_every_route(home, monkeypatch) -> None:
    async def go():
        async with service_client(monkeypatch, make_controller(home), handle=_OlderRelease()) as http:
            return await http.get("/healthz"), await http.post("/v1/profiles", json=BODY)

    for response in run(go()):
        assert response.status_code == 503
        assert response.json()["error"] == "controller_build_mismatch"
        assert "--replace-controller" in response.json()["detail"]


def test_healthz_names_the_build_the_service_and_its_controller_run(home, monkeypatch) -> None:
    async def go():
        async with service_client(monkeypatch, make_controller(home)) as http:
            return await http.get("/healthz")

    assert run(go()).json() == {"status": "ok", "build": build_id()}
