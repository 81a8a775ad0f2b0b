"""Scratch folders of rayprof's processes that someone else may kill, and the sweep of those left behind.

Ray Train ends a run by killing its workers (Train v2: ``ray.kill`` once they ran its shutdown callbacks, at most
5 s after asking), and ``rayprof serve --replace-controller`` kills the old controller's postprocess tasks: a
window's export folder (a compressed trace, tens of MB on a GPU job) or an out-of-memory snapshot still in flight
stays in the node's temp folder, where nothing removes it, and a cluster that runs for months fills its disks one
run at a time. Each folder's name carries the id of the process that made it, so a later rayprof process on the
node (every agent as it starts, the controller as it starts) removes those whose process is gone. Standard library
only: the agent imports it in the training process.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

__all__ = ["ORPHAN_MIN_AGE_S", "make_scratch", "scratch_prefix", "sweep_orphans"]

logger = logging.getLogger(__name__)

_PREFIX = "rayprof-p"
_NAME = re.compile(r"^rayprof-p(\d+)-")

ORPHAN_MIN_AGE_S = 3600.0
"""A folder younger than this is never swept, whatever its process: a process id means nothing across PID
namespaces (two containers sharing a temp folder), and a live rayprof process keeps a scratch folder this long
unchanged only for an out-of-memory snapshot the controller has not asked for (an export or upload takes seconds to
minutes); that process is alive in its own namespace, where its folder is never swept."""

# A temp folder holds many other programs' entries: the sweep looks at this many, at most, per call.
_MAX_ENTRIES = 10_000


def scratch_prefix(kind: str) -> str:
    """The name prefix of this process's scratch folders of ``kind`` (for ``mkdtemp`` or ``TemporaryDirectory``)."""
    return f"{_PREFIX}{os.getpid()}-{kind}-"


def make_scratch(kind: str) -> Path:
    """A new scratch folder of this process; its maker removes it, or a later sweep does once this process is gone."""
    return Path(tempfile.mkdtemp(prefix=scratch_prefix(kind)))


def sweep_orphans(root: Path | None = None, *, now: float | None = None, min_age_s: float = ORPHAN_MIN_AGE_S) -> list[Path]:
    """Remove the scratch folders under ``root`` (the temp folder) whose process is gone, left at least
    ``min_age_s`` ago; returns them. Never raises: a folder it cannot read or remove is left as it is."""
    root = Path(tempfile.gettempdir()) if root is None else root
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = os.scandir(root)
    except OSError:
        return removed
    with entries:
        for count, entry in enumerate(entries):
            if count >= _MAX_ENTRIES:
                break
            match = _NAME.match(entry.name)
            if match is None:
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
                if not entry.is_dir(follow_symlinks=False) or stat.st_uid != os.getuid():
                    continue
            except OSError:
                continue
            if now - stat.st_mtime < min_age_s or _alive(int(match.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if removed:
        logger.info("rayprof: removed %d scratch folders of processes that are gone (%s)", len(removed), root)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (not ours to judge), or no pid at all: leave it
    return True
