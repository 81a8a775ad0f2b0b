"""Which Python function the host runs outside any op, or reads a device value in, from a with_stack trace's frames.

Without stacks, host time in a step but in no op is "Python outside any op" and the fix can only say how to find
out. With them (``with_stack=True``; TraceLens' and many HF recordings have them) the innermost frame open at each
moment says which function it is. Only frames that name code a fix can change are kept: not the interpreter's
builtins (dropped at load), not torch's own Python (``module.py: _call_impl``, ``_device.py: __torch_function__``:
its overhead is its caller's), not numpy's or the standard library's (threading, multiprocessing, contextlib):
their time is named by the nearest frame of the user's code or of a library above them (``transformers``,
``PIL``).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import lru_cache

from orchestrator.analysis.intervals import Intervals, by_time, name_innermost
from orchestrator.models.analysis import OpStat
from orchestrator.traces.loader import Span

__all__ = ["callers", "frame_label", "frame_parts", "user_frames"]

# Kineto names a frame "<file>(<line>): <function>"; the file is relative to its sys.path entry where it has one.
_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
# Packages whose Python is plumbing around the user's code: their time is their caller's.
_PLUMBING = frozenset({"torch", "numpy", "typing_extensions", "_pytest", "pluggy"}) | frozenset(sys.stdlib_module_names)
_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python3[.\d]*/")


def _plumbing(path: str) -> bool:
    """A frame's file is torch's, numpy's or the standard library's (by its package, or where it lives)."""
    if path.startswith("/"):
        installed = _INSTALLED.split(path, maxsplit=1)
        if len(installed) == 1:
            return _STDLIB.search(path) is not None  # else a file of the user's own
        path = installed[1]
    return path.split("/", 1)[0].removesuffix(".py") in _PLUMBING


@lru_cache(maxsize=4096)
def _is_users(name: str) -> bool:
    match = _FRAME.match(name)
    return match is not None and not _plumbing(match["path"])


@lru_cache(maxsize=4096)
def frame_label(name: str) -> str:
    """``_preprocess_image (transformers/.../image_processing_videomae.py:178)``: the function first, so a cut
    keeps it."""
    match = _FRAME.match(name)
    return f"{match['func']} ({match['path']}:{match['line']})" if match else name


@lru_cache(maxsize=4096)
def frame_parts(name: str) -> tuple[str, str] | None:
    """A frame's file (relative to its site-packages where it is installed) and function, or None for no frame."""
    match = _FRAME.match(name)
    if match is None:
        return None
    return _INSTALLED.split(match["path"], maxsplit=1)[-1], match["func"]


def user_frames(frames: Iterable[Span]) -> list[Span]:
    """The frames that name the user's or a library's code, in the order
    :func:`~orchestrator.analysis.intervals.name_innermost` sweeps them."""
    return sorted((f for f in frames if _is_users(f.name)), key=lambda f: (f.ts, -f.end))


def callers(frames: Sequence[Span], waits: Intervals) -> list[OpStat]:
    """The innermost frame of the user's or a library's code (``frames``: :func:`user_frames`' order) around each of
    ``waits``, with the waits it holds and their time, most time first: who reads a device value back, by its line."""
    named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    name_innermost(frames, waits, frozenset(), named, "")
    named.pop("", None)  # in no frame: a trace without Python stacks
    return by_time(named)
