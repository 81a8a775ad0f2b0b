"""A control actor outlives upgrades (it is detached): a build id tells its code from its caller's, the
service refuses a controller of another build with what to do, and agents of another build (a job started
before the upgrade) are read and named. The real service app in process
(tests/support/inprocess_service.py); the replacement itself runs on a live cluster
(tests/live/test_faults.py::test_a_controller_of_an_older_release_is_refused_then_replaced)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from orchestrator.build import BEFORE_BUILD_IDS, build_id, check_build, release, source_digest
from orchestrator.cli import commands
from orchestrator.errors import ControllerBuildMismatchError, IncompatibleRecordError
from orchestrator.mcp.convert import target_list
from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.models.control import TargetInfo, WorkerStatus
from tests.support.common import cli_results
from tests.support.fake_agents import make_controller, run, worker_info
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
    assert check_build(build_id()) is None  # this build: no refusal


def test_a_controller_of_a_release_before_build_ids_is_refused_with_how_to_replace_it() -> None:
    with pytest.raises(ControllerBuildMismatchError) as raised:
        check_build(BEFORE_BUILD_IDS)
    refusal = raised.value
    assert refusal.code == "controller_build_mismatch" and refusal.http_status == 503
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


# ---- agents of another build (a job started before the upgrade) -------------------------------


def _as_unpickled_from_a_build_without(info: WorkerInfo, *fields: str) -> WorkerInfo:
    """``info`` as unpickling rebuilds it (``__new__``, then ``__setstate__``) from a build whose WorkerInfo
    lacked ``fields``: what the controller receives through Ray from such an agent."""
    state = info.__getstate__()
    state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k not in fields}
    state["__pydantic_fields_set__"] = state["__pydantic_fields_set__"] - set(fields)
    record = WorkerInfo.__new__(WorkerInfo)
    record.__setstate__(state)
    return record


def test_a_record_from_a_build_without_a_later_field_reads_as_its_default() -> None:
    # Before: AttributeError ('WorkerInfo' object has no attribute 'build') wherever the controller read it.
    record = _as_unpickled_from_a_build_without(worker_info(0, 1), "build")
    assert record.build is None
    assert record == worker_info(0, 1).model_copy(update={"build": None})


def test_a_record_from_a_build_without_a_required_field_is_refused_with_what_to_do() -> None:
    with pytest.raises(IncompatibleRecordError, match="WorkerInfo from another rayprof build lacks torch_version: restart"):
        _as_unpickled_from_a_build_without(worker_info(0, 1), "torch_version")


def test_targets_name_the_ranks_whose_agents_run_another_build(home) -> None:
    async def go():
        c = make_controller(home)
        for rank, build in ((0, build_id()), (1, None)):
            await c.register(worker_info(rank, 2).model_copy(update={"build": build}))
        return await c.targets()

    (target,) = run(go())
    assert target.other_build_ranks == [1]


@pytest.mark.parametrize(
    ("ranks", "said"),
    [([1], "run: the agents of ranks 1 run another rayprof build"), ([0, 1], "run: every rank's agent runs another rayprof build")],
)
def test_rayprof_targets_says_to_restart_a_job_whose_agents_run_another_build(monkeypatch, ranks, said) -> None:
    line = _other_build_line(monkeypatch, ranks, agents_build="0.0.9+0123456789ab")
    assert line.startswith(said) and line.endswith("restart the job to profile it with this build")


def test_rayprof_targets_says_to_replace_a_controller_older_than_the_job(monkeypatch) -> None:
    # A job started after an upgrade, beside a controller started before it: the agents run this rayprof's build,
    # and restarting the job (what the line said before) changes nothing.
    line = _other_build_line(monkeypatch, [0, 1], agents_build=build_id())
    assert line.startswith("run: every rank's agent runs another rayprof build than the controller (they run this")
    assert line.endswith("replace it with `rayprof serve --replace-controller` and the --storage it was first started with")


def _other_build_line(monkeypatch, ranks: list[int], agents_build: str) -> str:
    """What `rayprof targets` says of a run whose ``ranks`` run another build than the controller, ``agents_build``."""
    infos = {r: worker_info(r, 2).model_copy(update={"build": agents_build if r in ranks else build_id()}) for r in (0, 1)}
    ranks_now = [WorkerStatus(info=infos[r], step=10, step_time_s=0.1, last_seen_s=0.5) for r in (0, 1)]
    target = TargetInfo(name="run", world_size=2, ranks=ranks_now, other_build_ranks=ranks)
    monkeypatch.setattr(commands, "_client", lambda args: type("C", (), {"targets": lambda self: [target]})())

    status, printed = cli_results(commands.targets, argparse.Namespace(json=False))
    assert status == 0
    (line,) = [line for line in printed.splitlines() if "another rayprof build" in line]
    return line


def test_the_mcp_target_list_names_the_ranks_whose_agents_run_another_build() -> None:
    ranks = [WorkerStatus(info=worker_info(r, 2), step=10, step_time_s=0.1, last_seen_s=0.5) for r in (0, 1)]
    (brief,) = target_list([TargetInfo(name="run", world_size=2, ranks=ranks, other_build_ranks=[1])]).targets
    assert brief.other_build_ranks == [1]
