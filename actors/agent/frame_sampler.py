"""While a window records, sample the training thread's Python stack every few milliseconds
(:class:`orchestrator.models.samples.FrameSamples`), for the report to name what the loop runs where no op does.

The sampler is a thread that exists only between a window's first step and its close: outside a window the step
path pays nothing for it. Each sample is one ``sys._current_frames()`` and a walk up the training thread's frames
(tens of microseconds, holding the GIL that long); a stack is named once, the first time it is seen.
"""

from __future__ import annotations

import logging
import os
import site
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType

from orchestrator.models.samples import FrameSamples

__all__ = ["FrameSampler", "frame_name", "import_prefixes"]

logger = logging.getLogger(__name__)

# Frames kept from the innermost out: Ray Data's wait sits ~10 deep, Ray Train's report ~6, below a loop that Ray
# Train runs ~15 deep; a runaway recursion stays bounded.
MAX_DEPTH = 64

_Key = tuple[tuple[CodeType, int], ...]
# The agent's own files (this folder), whose frames a sample leaves out where they are innermost.
_AGENT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


class FrameSampler:
    """Samples ``thread_id``'s stack every ``interval_s`` seconds from :meth:`start` to :meth:`stop`, at most
    ``max_samples`` times."""

    def __init__(
        self, thread_id: int, interval_s: float, max_samples: int, clock_ns: Callable[[], int] = time.time_ns
    ) -> None:
        self.thread_id = thread_id
        self.interval_s = interval_s
        self.max_samples = max_samples
        self._clock_ns = clock_ns
        self._index: dict[_Key, int] = {}
        self._stacks: list[list[str]] = []
        self._samples: list[tuple[int, int]] = []
        self._truncated = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayprof-frames", daemon=True)
        self._prefixes = import_prefixes()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> FrameSamples | None:
        """Stop sampling and return what was seen (None: not one sample)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        if not self._samples:
            return None
        # Built here from this sampler's own records: nothing to validate, and a long window's samples would cost
        # the training thread, which calls this at the window's close, a validation pass.
        return FrameSamples.model_construct(
            interval_ms=self.interval_s * 1000, stacks=self._stacks, samples=self._samples, truncated=self._truncated
        )

    def _run(self) -> None:
        try:
            while not self._stopping.wait(self.interval_s):
                if len(self._samples) >= self.max_samples:
                    self._truncated = True
                    return
                if not self.sample():
                    return  # the training thread has ended: a window it never closed
        except Exception:  # A sampler that fails costs the report its samples, never the training.
            logger.exception("rayprof: sampling the training thread's stack failed")

    def sample(self) -> bool:
        """Take one sample now (the sampling thread calls this; a test may too); False where the thread is gone."""
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return False
        # The agent's own frames on top (the garbage-collection watch's callback, where a sample waits for the GIL
        # through a collection and lands as it ends) are not the loop's: the sample names the line they run under.
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_AGENT_DIR):
            frame = frame.f_back
        key = _key(frame)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self._stacks)
            self._stacks.append([frame_name(code, line, self._prefixes) for code, line in key])
        self._samples.append((self._clock_ns() // 1000, index))
        return True


def frame_name(code: CodeType, line: int, prefixes: list[str]) -> str:
    """A frame as torch's with_stack names it: its file below the import path that holds it (one of ``prefixes``,
    :func:`import_prefixes`), its line and its function ('train.py(88): train_step')."""
    path = code.co_filename
    short = next((path[len(p):] for p in prefixes if path.startswith(p)), path)
    return f"{short}({line}): {_qualname(code)}"


def import_prefixes() -> list[str]:
    """The folders a file's name is shortened below, longest first: those torch's with_stack tracer shortens below
    (site-packages, the import path, the user's site), so a sampled frame and a traced one read alike."""
    raw = [*site.getsitepackages(), *sys.path, site.getuserbase(), site.getusersitepackages()]
    return sorted({os.path.join(os.path.abspath(p), "") for p in raw if p}, key=len, reverse=True)


def _qualname(code: CodeType) -> str:
    """A function's name with its class (``WeightConverter.__init__``: with_stack's bare ``__init__`` says not whose),
    on Python 3.11 and later; its bare name before."""
    return getattr(code, "co_qualname", code.co_name)


def _key(frame: FrameType | None) -> _Key:
    out: list[tuple[CodeType, int]] = []
    while frame is not None and len(out) < MAX_DEPTH:
        out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(out)
