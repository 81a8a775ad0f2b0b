"""Per-rank postprocessing as Ray tasks: the cluster parses the traces, the controller joins the results.

:class:`RayRankMap` is a :data:`~orchestrator.traces.fanout.RankMap` that runs
each ``fn(trace, arg)`` as its own task, keeps at most ``in_flight`` running
(the cluster's CPU count: each task holds one rank's batch and its
summary, 50-200 MB, so 64 at once would not fit a small node), yields results
in rank order as they arrive, reports ``analysing 12/64 ranks`` through
``on_progress``, and stops at its next wait once :meth:`cancel` is called.
Tasks ask for no CPU, as the single postprocess task did: a training job that
holds every CPU must not starve its own profile's report. Each rank's task
runs on that rank's node (soft affinity: another node if that one is gone),
which spreads them over the nodes, not only the controller's, and only onto
nodes that answered in this very window: Ray's SPREAD may pick a node that
has dropped off the network, where a task waits until Ray declares the node
dead (tests/live/test_netns.py).

``submit``/``wait``/``get``/``kill`` default to Ray's and are seams for tests.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.models.profile import PostprocessProgress
from orchestrator.traces.discover import TraceFile
from orchestrator.traces.fanout import RankFn

__all__ = ["PostprocessCancelled", "RayRankMap"]

R = TypeVar("R")

_POLL_S = 0.5  # how soon a cancel is noticed


class PostprocessCancelled(Exception):
    """The postprocess ran past its timeout; the tasks still running were cancelled."""


@ray.remote(num_cpus=0, max_retries=1)
def _rank_task(fn: RankFn[Any], tf: TraceFile, arg: Any) -> Any:
    return fn(tf, arg)


def _submit(fn: RankFn[Any], tf: TraceFile, arg: Any, node_id: str | None) -> Any:
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=True) if node_id else "SPREAD"
    return _rank_task.options(scheduling_strategy=strategy).remote(fn, tf, arg)


def _wait(refs: list[Any], timeout: float) -> list[Any]:
    return ray.wait(refs, num_returns=1, timeout=timeout)[0]


def _kill(ref: Any) -> None:
    ray.cancel(ref, force=True)


class RayRankMap:
    def __init__(
        self,
        on_progress: Callable[[PostprocessProgress], None],
        in_flight: int,
        *,
        nodes: Mapping[int, str] | None = None,
        submit: Callable[[RankFn[Any], TraceFile, Any, str | None], Any] = _submit,
        wait: Callable[[list[Any], float], list[Any]] = _wait,
        get: Callable[[Any], Any] = ray.get,
        kill: Callable[[Any], None] = _kill,
    ) -> None:
        self._on_progress = on_progress
        self._in_flight = max(1, in_flight)
        self._nodes = dict(nodes or {})  # rank -> the node id its task runs on
        self._submit, self._wait, self._get, self._kill = submit, wait, get, kill
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def __call__(self, fn: RankFn[R], items: list[tuple[TraceFile, Any]], phase: str) -> Iterator[R]:
        pending = deque(enumerate(items))
        running: dict[Any, int] = {}
        finished: dict[int, Any] = {}
        done = next_out = 0
        self._on_progress(PostprocessProgress(phase=phase, done=0, total=len(items)))  # type: ignore[arg-type]
        try:
            while pending or running or finished:
                if self._cancelled.is_set():
                    raise PostprocessCancelled(f"cancelled while {phase} {done}/{len(items)} ranks")
                while pending and len(running) < self._in_flight:
                    index, (tf, arg) = pending.popleft()
                    running[self._submit(fn, tf, arg, self._nodes.get(tf.rank))] = index
                for ref in self._wait(list(running), _POLL_S) if running else []:
                    finished[running.pop(ref)] = ref
                    done += 1
                    self._on_progress(PostprocessProgress(phase=phase, done=done, total=len(items)))  # type: ignore[arg-type]
                while next_out in finished:  # in rank order: the merge writes ranks in turn
                    yield self._get(finished.pop(next_out))
                    next_out += 1
        finally:
            for ref in running:  # on cancel, an error, or a caller that stopped early
                self._kill(ref)
