"""The child processes a rank starts off its training thread (the trace export, a snapshot's
page), and a CUDA allocator snapshot taken to storage with its page.

Parsing a trace or rendering a page in the training process would hold the GIL for hundreds
of milliseconds; in a child at the lowest CPU priority the training process keeps its cores.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from actors.agent.cuda_memory import dump_snapshot
from actors.export.contract import SNAPSHOT_NAME, SNAPSHOT_PAGE_NAME
from orchestrator.models.profile import Artifact
from orchestrator.storage import Storage

__all__ = ["CHILD_TIMEOUT_S", "run_child", "store_snapshot"]

# Generous: a 512 MiB trace parses in well under a minute.
CHILD_TIMEOUT_S = 600


def run_child(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a child process, bounded, at the lowest CPU priority: on a busy node the
    training process keeps its cores and the child waits (measured with all options on 2 cores:
    steps during the export 1.83x -> 1.54x)."""
    cmd = [sys.executable, *args]
    nice = shutil.which("nice")
    cmd = [nice, "-n", "19", *cmd] if nice else cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)


def store_snapshot(
    snapshot: dict[str, Any] | Path, tmp: Path, keys: dict[str, str], storage: Storage, title: str
) -> list[Artifact]:
    """The allocator's snapshot as torch's viewers read it (``snapshot``, or the pickle already
    written there) and its page that needs no internet, stored under ``keys`` (layout's
    ``memory_snapshot`` and ``memory_view``) in ``storage``, scoped to the profile's folder."""
    if isinstance(snapshot, Path):
        pickled = snapshot
    else:
        pickled = tmp / SNAPSHOT_NAME
        dump_snapshot(snapshot, pickled)
    page = tmp / SNAPSHOT_PAGE_NAME
    done = run_child(["-m", "actors.export.memory_view", str(pickled), str(page), title])
    if done.returncode != 0:
        raise RuntimeError(f"memory snapshot page exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return [
        storage.put_file(pickled, keys["memory_snapshot"], "memory_snapshot"),
        storage.put_file(page, keys["memory_view"], "memory_view"),
    ]
