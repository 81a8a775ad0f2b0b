"""Which rayprof a process runs: its release, and a build id that tells two builds of one release apart.

The control actor is detached: it keeps the code it started with for as long as the cluster lives, through
every upgrade of the package beside it. A service or client that meets it compares build ids
(:mod:`actors.controller.upgrade`) rather than release numbers, because a source tree or a rebuilt wheel keeps its
release number while its code changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

from orchestrator.errors import ControllerBuildMismatchError

__all__ = ["BEFORE_BUILD_IDS", "build_id", "check_build", "release", "source_digest"]

# What a control actor of a release before build ids answers to ping.
BEFORE_BUILD_IDS = "ok"
# The packages whose code the control actor, the service and the clients run.
_PACKAGES = ("orchestrator", "actors")


def release() -> str:
    """The version has one source, pyproject.toml, read back from the installed package's metadata."""
    try:
        return metadata.version("rayprof")
    except metadata.PackageNotFoundError:
        return "(not installed: run from a source tree)"


def source_digest(roots: Iterable[Path]) -> str:
    """A digest of every ``.py`` file under ``roots``, by path relative to its root and content: the same for
    the same code wherever it is installed, different when any file differs."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            name = f"{root.name}/{path.relative_to(root).as_posix()}".encode()
            data = path.read_bytes()
            h.update(b"%d:%s%d:" % (len(name), name, len(data)))
            h.update(data)
    return h.hexdigest()[:12]


@cache
def build_id() -> str:
    """``<release>+<digest of the code>`` of this process, computed the first time it is asked (a few ms): ask
    it at startup, before anything could replace the files on disk."""
    here = Path(__file__).resolve().parent
    return f"{release()}+{source_digest(here.parent / name for name in _PACKAGES)}"


def check_build(found: str) -> None:
    """Refuse a controller that answered ``ping`` with ``found`` unless it runs this build."""
    ours = build_id()
    if found == ours:
        return
    theirs = "a rayprof release from before build ids" if found == BEFORE_BUILD_IDS else f"rayprof build {found}"
    raise ControllerBuildMismatchError(
        f"the rayprof control actor runs {theirs}; this is build {ours}. A detached actor keeps the code it started "
        "with through an upgrade. Replace it: `rayprof serve --replace-controller` with the --storage it was first "
        "started with (Python: ProfilingClient.in_cluster(replace_controller=True)); the new one restores saved "
        "profiles, watches and schedules from that storage, and a profile in progress completes, as after a restart."
    )
