"""How per-rank work is spread: the seam between the trace code and whatever runs it.

Merging and analysis call a :data:`RankMap` with a module-level function and
``(trace file, argument)`` pairs; it returns the results in the same order.
:func:`serial` runs them here, :func:`process_pool` in local processes (the
CLI and benchmarks), and the controller runs each as a Ray task on the
cluster (:mod:`actors.controller.profiles.ray_rank_map`), fetching the rank's file where the
task lands. Results are small (summaries, histograms, compressed parts), so
the caller joins them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.merge_stats import RejectedTrace
from orchestrator.scratch import scratch_prefix
from orchestrator.storage import open_storage
from orchestrator.traces.discover import TraceFile

__all__ = ["RankFn", "RankMap", "fetching", "process_pool", "serial"]

R = TypeVar("R")
RankFn = Callable[[TraceFile, Any], R]


class RankMap(Protocol):
    def __call__(self, fn: RankFn[R], items: list[tuple[TraceFile, Any]], phase: str) -> Iterator[R]:
        """``fn(trace, arg)`` for every pair, results in order; ``phase`` names the step for progress."""
        ...


def serial(fn: RankFn[R], items: list[tuple[TraceFile, Any]], phase: str = "") -> Iterator[R]:
    """One rank after another, in this process."""
    return (fn(tf, arg) for tf, arg in items)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the rank's own call reports a missing file


@contextmanager
def process_pool(workers: int | None = None) -> Iterator[RankMap]:
    """A :data:`RankMap` over ``workers`` local processes (default: one per core this process may use).

    Forked on Linux when this process runs a single thread: the workers start
    in milliseconds with the trace modules already imported (spawned, each
    imports them again: ~0.3 s before the first rank, measured). With other
    threads running, a fork could copy a lock one of them holds, and macOS's
    system libraries are not fork-safe, so there they are spawned.
    """
    import multiprocessing

    method = "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:

        def run(fn: RankFn[R], items: list[tuple[TraceFile, Any]], phase: str = "") -> Iterator[R]:
            # Largest file first, so no worker starts a big rank while the others sit idle at the end;
            # the results still come back in the order given.
            order = sorted(range(len(items)), key=lambda i: -_size(items[i][0].path))
            futures = {i: pool.submit(fn, *items[i]) for i in order}
            return (futures[i].result() for i in range(len(items)))

        yield run


class _FetchThen:
    """``fn`` on a local copy of the rank's file, downloaded (sha256 checked) where it runs, then deleted."""

    def __init__(self, fn: RankFn[Any], spec: StorageSpec, prefix: str) -> None:
        self.fn, self.spec, self.prefix = fn, spec, prefix

    def __call__(self, tf: TraceFile, packed: tuple[Any, str]) -> Any:
        arg, sha256 = packed
        with tempfile.TemporaryDirectory(prefix=scratch_prefix("rank")) as tmp:
            files = open_storage(self.spec).scoped(self.prefix)
            local = files.download(tf.path.as_posix(), Path(tmp) / tf.path.name, sha256)
            result = self.fn(tf.model_copy(update={"path": local}), arg)
        # Name the file by its key, not by the copy that is gone (also in a tuple of results from one read).
        if isinstance(result, tuple):
            return tuple(_named(r, tf.path) for r in result)
        return _named(result, tf.path)


def _named(result: Any, path: Path) -> Any:
    return result.model_copy(update={"path": path}) if isinstance(result, RejectedTrace) else result


def fetching(rank_map: RankMap, spec: StorageSpec, prefix: str, sha256: dict[Path, str]) -> RankMap:
    """``rank_map`` over trace files whose ``path`` is a storage key under ``prefix``: each call fetches its file."""

    def run(fn: RankFn[R], items: list[tuple[TraceFile, Any]], phase: str = "") -> Iterator[R]:
        return rank_map(_FetchThen(fn, spec, prefix), [(tf, (arg, sha256[tf.path])) for tf, arg in items], phase)

    return run
