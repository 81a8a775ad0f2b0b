"""An OOM watch's part on one rank: the CUDA allocator's history while the watch exists, the
snapshot of an out-of-memory error taken before the job sees it, and snapshots on request.

The controller turns recording on and off with ``memory_history`` commands. When an
allocation fails, torch calls the observer on the allocating thread before it raises: the
observer writes the snapshot to a local file (milliseconds), hands an :class:`OomReport` to the
agent's thread, and holds the failing thread, bounded by ``RAYPROF_OOM_HOLD_S``, until the
controller's bundle has stored that snapshot, because the exception that follows usually ends
the process. The exception itself and everything the job does with it are unchanged.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from actors.agent.children import store_snapshot
from actors.agent.cuda_memory import Allocator, dump_snapshot
from orchestrator.layout import rank_artifact_keys
from orchestrator.models.agent_protocol import OomReport, SnapshotDestination, WorkerInfo
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Artifact
from orchestrator.scratch import make_scratch
from orchestrator.settings import (
    DEFAULT_MEMORY_SNAPSHOT_MAX_ENTRIES,
    DEFAULT_OOM_HOLD_S,
    MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR,
    OOM_HOLD_S_ENV_VAR,
    env_float,
    env_int,
)
from orchestrator.storage import open_storage

__all__ = ["MemoryWatch"]

logger = logging.getLogger(__name__)

# A job that catches its OOMs and retries (smaller batches) must not dump a snapshot per try.
OOM_MIN_INTERVAL_S = 60.0


class MemoryWatch:
    """One rank's history recording for OOM watches; ``report`` hands an OOM to the agent's thread."""

    def __init__(
        self,
        info: WorkerInfo,
        allocator: Allocator,
        report: Callable[[OomReport], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._info = info
        self._allocator = allocator
        self._report = report
        self._clock = clock
        self._hold_s = env_float(OOM_HOLD_S_ENV_VAR, DEFAULT_OOM_HOLD_S)
        self.recording = False
        self._observing = False
        self._last_oom = -OOM_MIN_INTERVAL_S
        # The failing rank's snapshot, kept until a bundle stores it; set when it has been.
        self._kept: Path | None = None
        self._stored = threading.Event()
        self._lock = threading.Lock()

    def record(self, on: bool) -> None:
        """Start or stop recording (the agent's thread, on ``memory_history``); idempotent."""
        with self._lock:
            if on == self.recording:
                return
            if on:
                why = self._allocator.unavailable()
                if why is not None:
                    logger.info("rayprof agent: an OOM watch cannot record on rank %d: %s", self._info.world_rank, why)
                    return
                self._allocator.start(env_int(MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR, DEFAULT_MEMORY_SNAPSHOT_MAX_ENTRIES))
                if not self._observing:  # torch has no way to detach an observer: attach one for the process
                    self._allocator.observe_oom(self._on_oom)
                    self._observing = True
            else:
                self._allocator.stop()
            self.recording = on

    def _on_oom(self, device: int, asked: int, limit: int, free: int) -> None:
        """torch's out-of-memory observer: the allocating thread, before the exception. Never raises."""
        try:
            now = self._clock()
            with self._lock:
                if not self.recording or now - self._last_oom < OOM_MIN_INTERVAL_S or self._kept is not None:
                    return
                self._last_oom = now
                folder = make_scratch("oom")
                path = folder / f"rank{self._info.world_rank}.snapshot.pickle"
                dump_snapshot(self._allocator.snapshot(), path)
                self._kept = path
                self._stored.clear()
            self._report(
                OomReport(
                    agent_id=self._info.agent_id, device=device, asked_bytes=max(0, asked),
                    limit_bytes=max(0, limit), free_bytes=max(0, free), at=utcnow(),
                )
            )
        except Exception:
            logger.exception("rayprof agent: keeping the out-of-memory snapshot failed")
            return
        # Outside the lock: the agent's thread stores the snapshot while this thread waits.
        self._stored.wait(self._hold_s)

    def snapshot_to(self, dest: SnapshotDestination, title: str) -> tuple[list[Artifact], str | None]:
        """This rank's snapshot stored at ``dest`` (the agent's thread, on ``stacks``): the one kept
        at an OOM, else one taken now. Returns its artifacts, or why there are none."""
        with self._lock:
            kept, self._kept = self._kept, None
            recording = self.recording
        if kept is None and not recording:
            return [], "this rank records no allocator history (no CUDA device, or no OOM watch reached it)"
        tmp = make_scratch("snapshot")
        try:
            keys = rank_artifact_keys(self._info.world_rank, self._info.host, self._info.pid)
            snapshot = kept if kept is not None else self._allocator.snapshot()
            return store_snapshot(snapshot, tmp, keys, open_storage(dest.storage).scoped(dest.prefix), title), None
        except Exception as e:
            logger.exception("rayprof agent: storing the memory snapshot failed")
            return [], f"the snapshot could not be stored: {type(e).__name__}: {e}"[:500]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if kept is not None:
                shutil.rmtree(kept.parent, ignore_errors=True)
                self._stored.set()
