"""Which Python function the host runs outside any op, reads a device value in, or loads data in (the hot path inside
DataLoader next() and who iterates the loader), from a with_stack trace's frames.

Without stacks, host time in a step but in no op is "Python outside any op" and the fix can only say how to find
out. With them (``with_stack=True``; TraceLens' and many HF recordings have them) the innermost frame open at each
moment says which function it is. Only frames that name code a fix can change are kept: not the interpreter's
builtins (dropped at load), not torch's own Python (``module.py: _call_impl``, ``_device.py: __torch_function__``:
its overhead is its caller's), not numpy's or the standard library's (threading, multiprocessing, contextlib), nor
DeepSpeed's wrappers of torch.distributed: their time is named by the nearest frame of the user's code or of a library
above them (``transformers``, ``PIL``).
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from functools import lru_cache

from orchestrator.analysis.intervals import Intervals, by_time, name_innermost, total
from orchestrator.models.analysis import OpStat
from orchestrator.traces.loader import Span

__all__ = [
    "EVALUATION", "HOT_SHARE", "callers", "enclosing", "frame_file", "frame_function", "frame_label", "frame_parts", "hot_path", "is_users",
    "sampled_path", "sampled_spot", "spot_and_caller", "user_frames",
]

# Kineto names a frame "<file>(<line>): <function>"; the file is relative to its sys.path entry where it has one.
_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
# Frames Python gives code inside a function: their time is the function's.
_ANONYMOUS = re.compile(r"[:.] ?<(?:listcomp|dictcomp|setcomp|genexpr|lambda)>$")
# Packages whose Python is plumbing around the user's code: their time is their caller's.
_PLUMBING = frozenset({"torch", "numpy", "typing_extensions", "_pytest", "pluggy"}) | frozenset(sys.stdlib_module_names)
# Files of a library that wrap torch.distributed as torch's own Python does: DeepSpeed's collectives and its NVTX
# decorator. A collective's caller is the frame that asked for it (``DeepSpeedZeroOptimizer.allreduce_bucket``).
_PLUMBING_FILES = ("deepspeed/comm/", "deepspeed/utils/nvtx.py")
# A frame holding this share of the time (or of the stack samples) it is asked about or more is on its hot path.
HOT_SHARE = 0.5
# Under this many stack samples a share is said as a count ("1 of 1", not "100%"): a 5 ms sampler's one sample of a
# 3 ms span is no proportion.
FEW_SAMPLES = 5
_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python3[.\d]*/")


def _plumbing(path: str) -> bool:
    """A frame's file is torch's, numpy's or the standard library's (by its package, or where it lives), or a library's
    wrapper of torch.distributed."""
    if path.startswith("/"):
        installed = _INSTALLED.split(path, maxsplit=1)
        if len(installed) == 1:
            return _STDLIB.search(path) is not None  # else a file of the user's own
        path = installed[1]
    return path.split("/", 1)[0].removesuffix(".py") in _PLUMBING or path.startswith(_PLUMBING_FILES)


@lru_cache(maxsize=4096)
def is_users(name: str) -> bool:
    """A frame (by its Kineto name) of the user's or a library's code: not torch's, numpy's or the standard library's."""
    match = _FRAME.match(name)
    return match is not None and not _plumbing(match["path"])


@lru_cache(maxsize=4096)
def frame_label(name: str, width: int | None = None) -> str:
    """``_preprocess_image (transformers/models/videomae/image_processing_videomae.py:178)``: the function first, so a
    cut keeps it; a function defined inside another by its own qualified name (``Module.validation_step``, not
    ``build.<locals>.Module.validation_step``). Over ``width`` characters, the path's middle folders are left out
    (``transformers/.../image_processing_videomae.py:178``), then the end is cut: never a file's name cut in two."""
    match = _FRAME.match(name)
    if match is None:
        return name if width is None else name[:width]
    func = match["func"].rsplit("<locals>.", 1)[-1]
    label = f"{func} ({match['path']}:{match['line']})"
    if width is None or len(label) <= width:
        return label
    folders = match["path"].split("/")
    if len(folders) > 2:
        label = f"{func} ({folders[0]}/.../{folders[-1]}:{match['line']})"
    return label[:width]


@lru_cache(maxsize=4096)
def frame_parts(name: str) -> tuple[str, str] | None:
    """A frame's file (relative to its site-packages where it is installed) and function, or None for no frame."""
    match = _FRAME.match(name)
    if match is None:
        return None
    return _INSTALLED.split(match["path"], maxsplit=1)[-1], match["func"]


# Functions of an evaluation: transformers' Trainer and Seq2SeqTrainer (sentence-transformers' builds on it), Lightning's
# module hooks, and the names other loops give theirs.
EVALUATION = frozenset({
    "evaluate", "evaluation_loop", "prediction_step", "predict", "validate", "validation_step", "test_step", "predict_step",
})


def frame_function(name: str) -> str:
    """A frame's function without its class (``evaluate`` of ``Trainer.evaluate``; '' for no frame)."""
    parts = frame_parts(name)
    return parts[1].rsplit(".", 1)[-1] if parts else ""


def user_frames(frames: Iterable[Span]) -> list[Span]:
    """The frames that name the user's or a library's code, in the order
    :func:`~orchestrator.analysis.intervals.name_innermost` sweeps them."""
    return sorted((f for f in frames if is_users(f.name)), key=lambda f: (f.ts, -f.end))


def callers(frames: Sequence[Span], waits: Intervals) -> list[OpStat]:
    """The innermost frame of the user's or a library's code (``frames``: :func:`user_frames`' order) around each of
    ``waits``, with the waits it holds and their time, most time first: who reads a device value back, by its line."""
    named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    name_innermost(frames, waits, frozenset(), named, "")
    named.pop("", None)  # in no frame: a trace without Python stacks
    return by_time(named)




def hot_path(frames: Sequence[Span], pieces: Intervals, share: float) -> list[OpStat]:
    """The hot path of the code ``pieces`` (sorted, apart) time, through the frames (:func:`user_frames`) opened
    inside them: from the outermost down, at each level the callee with most time, while it holds at least ``share``
    of the pieces' time; with its time and calls. By call path, not by name: a generator's frames, renamed by the line
    each resumption starts at, sit where they are called."""
    starts, ends = [s for s, _ in pieces], [e for _, e in pieces]
    paths: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    stack: list[tuple[float, tuple[str, ...]]] = []  # (end, path) of the open frames inside a piece
    for f in frames:
        i = bisect_right(starts, f.ts) - 1  # the last piece that starts by f.ts
        if i < 0 or f.ts >= ends[i]:
            continue
        while stack and stack[-1][0] <= f.ts:
            stack.pop()
        path = (*(stack[-1][1] if stack else ()), f.name)
        entry = paths[path]
        entry[0] += 1
        j = i  # its time in every piece it reaches, not only the one it opens in (else a callee outweighs it)
        while j < len(pieces) and starts[j] < f.end:
            entry[1] += min(f.end, ends[j]) - max(f.ts, starts[j])
            j += 1
        stack.append((f.end, path))
    children: dict[tuple[str, ...], list[tuple[float, int, str]]] = defaultdict(list)
    for path, (calls, us) in paths.items():
        children[path[:-1]].append((us, int(calls), path[-1]))
    floor, out = share * total(pieces), []
    at: tuple[str, ...] = ()
    while children.get(at):
        us, calls, name = max(children[at])
        if us < floor:
            break
        out.append(OpStat(name=name, calls=calls, total_ms=us / 1000))
        at = (*at, name)
    return out


def sampled_path(stacks: Sequence[Sequence[str]], share: float, interval_ms: float) -> list[OpStat]:
    """The hot path of stack samples (``stacks``: one per sample, innermost frame first, taken every
    ``interval_ms``), through the frames of the user's or a library's code: from the outermost down, at each level
    the function most samples hold (whichever of its lines they are at: a loop's samples spread over its lines),
    while it holds at least ``share`` of them; each named at its line most of them are at, with its samples as
    calls and their time (samples times the interval)."""
    root: _Node = _Node()
    for stack in stacks:
        node = root
        for frame in reversed(stack):
            if is_users(frame):
                node = node.children.setdefault(frame_parts(frame) or ("", frame), _Node())
                node.samples += 1
                node.lines[frame] += 1
    floor, out, node = share * len(stacks), [], root
    while node.children:
        child = max(node.children.values(), key=lambda c: (c.samples, c.name()))
        if child.samples < floor:
            break
        out.append(OpStat(name=child.name(), calls=child.samples, total_ms=child.samples * interval_ms))
        node = child
    return out


class _Node:
    """A function on the paths of stack samples: how many hold it there, at which of its lines, and the functions
    they call from it."""

    __slots__ = ("children", "lines", "samples")

    def __init__(self) -> None:
        self.samples = 0
        self.lines: Counter[str] = Counter()
        self.children: dict[tuple[str, str], _Node] = {}

    def name(self) -> str:
        """The frame (with its line) most of the samples holding this function are at; the first by name of a tie."""
        return min(self.lines.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def spot_and_caller(hot: Sequence[OpStat]) -> tuple[OpStat, OpStat | None] | None:
    """The deepest named frame of a hot path (a comprehension, generator expression or lambda is its function's:
    Python 3.11 gives each a frame of its own) and its nearest caller in another file (None: no caller there; None
    for an empty path)."""
    named = [f for f in hot if not _ANONYMOUS.search(f.name)] or list(hot)
    if not named:
        return None
    spot = named[-1]
    file = frame_file(spot.name)
    return spot, next((f for f in reversed(named[:-1]) if frame_file(f.name) != file), None)


def sampled_spot(path: Sequence[OpStat], samples: int) -> str:
    """Where a hot path of ``samples`` stack samples leads: '75% in save_file (safetensors/torch.py:286), called from
    save_model (...), under _save_checkpoint (...)': its deepest frame, the nearest caller in another file, and the
    path's first frame, where the work begins ('' for no path)."""
    found = spot_and_caller(path)
    if found is None or samples <= 0:
        return ""
    spot, caller = found
    called = f", called from {frame_label(caller.name)}" if caller is not None else ""
    under = f", under {frame_label(path[0].name)}" if path[0] not in (spot, caller) else ""
    share = f"{spot.calls / samples:.0%}" if samples >= FEW_SAMPLES else f"{spot.calls} of {samples}"
    return f"{share} in {frame_label(spot.name)}{called}{under}"


def frame_file(name: str) -> str:
    """A frame's file (as :func:`frame_parts` gives it; '' for no frame)."""
    parts = frame_parts(name)
    return parts[0] if parts else ""


def enclosing(frames: Sequence[Span], pieces: Intervals, depth: int) -> list[OpStat]:
    """The ``depth`` innermost frames (:func:`user_frames`' order) around each of ``pieces`` whole, with the pieces and
    their time: who runs the code the pieces time. Most time first; equal times innermost first."""
    named: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, depth])  # calls, µs, innermost position
    stack: list[Span] = []
    i, n = 0, len(frames)
    for a, b in pieces:
        while i < n and frames[i].ts <= a:
            while stack and stack[-1].end <= frames[i].ts:
                stack.pop()
            stack.append(frames[i])
            i += 1
        while stack and stack[-1].end < b:  # ended inside this piece: around no later one either
            stack.pop()
        seen: set[str] = set()  # a recursive frame holds the piece once
        for position, frame in enumerate(reversed(stack[-depth:])):
            if frame.name in seen:
                continue
            seen.add(frame.name)
            entry = named[frame.name]
            entry[0] += 1
            entry[1] += b - a
            entry[2] = min(entry[2], position)
    rows = sorted(named.items(), key=lambda kv: (-kv[1][1], kv[1][2], kv[0]))
    return [OpStat(name=name, calls=int(calls), total_ms=us / 1000) for name, (calls, us, _) in rows]
