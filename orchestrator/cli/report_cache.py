"""Where `rayprof report ID` keeps the profiles it downloads: one folder per profile under ``RAYPROF_CACHE_DIR``,
reused when the same profile is reported again, the latest few kept (a GPU job's profile can be GBs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from orchestrator.client import ProfileHandle
from orchestrator.config import cache_profiles, report_cache

__all__ = ["cached_folder", "fetched", "keep_latest"]


def fetched(handle: ProfileHandle) -> Path:
    """``handle``'s profile in the cache (what `report ID` and one stored side of `diff` read): the files not there
    yet downloaded, sha256 verified, and the cache trimmed after."""
    folder = handle.download(cached_folder(handle.target, handle.id))
    keep_latest(folder)
    return folder


def cached_folder(target: str, profile_id: str, root: Path | None = None) -> Path:
    """The cache's folder for one profile (``target`` and ``profile_id`` are names: no separators, no ``..``)."""
    return (root or report_cache()) / "profiles" / target / profile_id


def keep_latest(used: Path, kept: int | None = None) -> list[Path]:
    """Mark ``used`` (a :func:`cached_folder`) as just used and remove all but the ``kept`` most recently used
    profile folders beside it; what was removed. A folder that cannot be removed stays: the report goes on."""
    kept = cache_profiles() if kept is None else kept
    os.utime(used)
    used_at: dict[Path, float] = {}
    for target in used.parent.parent.iterdir():
        try:
            for folder in target.iterdir():
                if folder.is_dir():
                    used_at[folder] = folder.stat().st_mtime
        except (FileNotFoundError, NotADirectoryError):
            continue  # not a target's folder, or another `rayprof report` just removed it
    folders = sorted(used_at, key=used_at.__getitem__, reverse=True)
    removed = [p for p in folders[kept:] if p != used]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed
