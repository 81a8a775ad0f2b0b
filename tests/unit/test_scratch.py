"""Scratch folders a killed process leaves are removed by a later one; nothing else is touched."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from actors.agent.runtime import Agent
from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.scratch import ORPHAN_MIN_AGE_S, make_scratch, sweep_orphans
from tests.support.fake_agents import make_controller

REPO = Path(__file__).resolve().parents[2]


class _Stop(BaseException):
    """Ends an agent's thread loop, which retries every Exception."""


def _later() -> float:
    """A moment past the age below which no folder is swept."""
    return time.time() + ORPHAN_MIN_AGE_S + 60


def _child(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _left_by_a_gone_process(tmp: Path) -> Path:
    made = _child("from orchestrator.scratch import make_scratch; print(make_scratch('prof'))", tmp)
    assert made.returncode == 0, made.stderr
    return Path(made.stdout.strip())


def test_a_worker_killed_while_uploading_leaves_its_trace_folder_and_the_next_sweep_removes_it(tmp_path):
    killed = subprocess.run(
        [sys.executable, "-m", "tests.support.killed_upload", str(tmp_path / "store")],
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}, cwd=REPO,
        capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    (left,) = [p for p in tmp_path.iterdir() if p.name.startswith("rayprof-")]
    assert any(left.iterdir())  # the exported trace, never uploaded

    assert sweep_orphans(tmp_path, now=_later()) == [left]
    assert not left.exists()


def _aged(folder: Path) -> Path:
    old = time.time() - ORPHAN_MIN_AGE_S - 60
    os.utime(folder, (old, old))
    return folder


def test_an_agent_sweeps_its_node_as_its_thread_starts(tmp_path, monkeypatch):
    left = _aged(_left_by_a_gone_process(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    agent = Agent(WorkerInfo(
        agent_id="a1", target="unit", world_rank=0, world_size=1, local_rank=0, node_rank=0,
        node_id="n", host="h", pid=os.getpid(), device="cpu", torch_version=torch.__version__,
    ))

    def stop() -> None:
        raise _Stop

    monkeypatch.setattr(agent, "_find_upstream", stop)
    with pytest.raises(_Stop):
        agent._run()  # on this thread: it sweeps, then looks for the controller

    assert not left.exists()


def test_the_controller_sweeps_its_node_as_it_starts(home, tmp_path, monkeypatch):
    left = _aged(_left_by_a_gone_process(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    async def go() -> bool:
        await make_controller(home).ping()
        for _ in range(200):  # the sweep runs on a worker thread: bounded by count and by the test's timeout
            if not left.exists():
                return True
            await asyncio.sleep(0.05)
        return False

    assert asyncio.run(asyncio.wait_for(go(), 60))


def test_a_folder_of_a_live_process_is_kept_however_old(tmp_path):
    mine = make_scratch("prof")

    assert sweep_orphans(mine.parent, now=_later()) == []
    assert mine.exists()


def test_a_recent_folder_of_a_gone_process_is_kept(tmp_path):
    left = _left_by_a_gone_process(tmp_path)

    assert sweep_orphans(tmp_path) == []
    assert left.exists()


def test_folders_rayprof_did_not_name_so_are_kept(tmp_path):
    downloaded = tmp_path / "rayprof-k2j4x9"  # `rayprof download` with no --dest: the user's files
    older_release = tmp_path / "rayprof-prof-20261201-023136-730b9cd7-ou8yaxho"  # no process id in the name
    other = tmp_path / "somebody-else"
    for folder in (downloaded, older_release, other):
        folder.mkdir()
        os.utime(folder, (0, 0))

    assert sweep_orphans(tmp_path, now=_later()) == []
    assert downloaded.exists() and older_release.exists() and other.exists()


def test_a_file_with_a_scratch_name_is_not_removed(tmp_path):
    gone = _left_by_a_gone_process(tmp_path)
    gone.rmdir()
    gone.write_text("not a folder")

    assert sweep_orphans(tmp_path, now=_later()) == []
    assert gone.read_text() == "not a folder"


def test_a_missing_temp_folder_sweeps_nothing(tmp_path):
    assert sweep_orphans(tmp_path / "absent", now=_later()) == []
