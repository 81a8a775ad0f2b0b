"""The CUDA caching allocator's history: the one seam between rayprof and torch's private memory API.

``torch.cuda.memory._record_memory_history``, ``torch.cuda.memory._snapshot`` and
``torch._C._cuda_attach_out_of_memory_observer`` are underscore APIs. Everything rayprof
calls of them is here, so a torch release that changes them is one file to fix, and the
tests drive :class:`Allocator`'s fake (``tests/support/fake_allocator.py``) on machines without CUDA.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Allocator", "OomCallback", "TorchAllocator", "dump_snapshot"]

logger = logging.getLogger(__name__)

# (device index, bytes asked for, the device's memory or the share the process may use, bytes free on it)
OomCallback = Callable[[int, int, int, int], None]


class Allocator(Protocol):
    """What a window and the OOM watch need of the caching allocator."""

    def unavailable(self) -> str | None:
        """Why history cannot be recorded in this process, or ``None`` when it can."""
        ...

    def start(self, max_entries: int) -> None:
        """Record every allocation and free from now on, at most ``max_entries`` kept (Python stacks only).

        Starts and stops are counted: recording goes on until every start has had its stop (a
        window's snapshot and an OOM watch share the process's one history)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The allocator's segments and the recorded history (``torch.cuda.memory._snapshot()``)."""
        ...

    def stop(self) -> None:
        """Stop recording and drop the history."""
        ...

    def observe_oom(self, callback: OomCallback) -> None:
        """Call ``callback`` on the allocating thread when an allocation fails, before torch raises."""
        ...


class TorchAllocator:
    """The real allocator of this process's CUDA devices."""

    # The history is one per process, whoever asked for it.
    _lock = threading.Lock()
    _recorders = 0

    def unavailable(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "this worker has no CUDA device (a memory snapshot records the CUDA caching allocator)"
        return None

    def start(self, max_entries: int) -> None:
        import torch

        with TorchAllocator._lock:
            TorchAllocator._recorders += 1
            if TorchAllocator._recorders == 1:
                # Python frames only: C++ frames cost a symbolization per allocation (torch's own
                # advice for long recordings), and a training step allocates thousands of blocks.
                torch.cuda.memory._record_memory_history(
                    enabled="all", context="all", stacks="python", max_entries=max_entries
                )

    def snapshot(self) -> dict[str, Any]:
        import torch

        snapshot: dict[str, Any] = torch.cuda.memory._snapshot()
        return snapshot

    def stop(self) -> None:
        import torch

        with TorchAllocator._lock:
            TorchAllocator._recorders = max(0, TorchAllocator._recorders - 1)
            if TorchAllocator._recorders == 0:
                torch.cuda.memory._record_memory_history(enabled=None)

    def observe_oom(self, callback: OomCallback) -> None:
        import torch

        # Not in torch's type stubs, though torch's own docs use it for exactly this.
        torch._C._cuda_attach_out_of_memory_observer(callback)  # type: ignore[attr-defined]


def dump_snapshot(snapshot: dict[str, Any], path: Path) -> int:
    """Write ``snapshot`` as torch's own viewers read it (a pickle, as ``_dump_snapshot`` writes); returns its size."""
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return path.stat().st_size
