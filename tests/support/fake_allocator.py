"""A stand-in for the CUDA caching allocator (``actors.agent.cuda_memory.Allocator``) on machines without CUDA.

The test "allocates" by calling :meth:`FakeAllocator.alloc` / :meth:`free`; while recording, each
call is an event in torch's snapshot format (``device_traces`` entries with ``action``, ``addr``,
``size``, ``time_us`` and Python ``frames``), and :meth:`oom` calls the observer as torch does
before it raises.
"""

from __future__ import annotations

from typing import Any

import torch

from actors.agent.cuda_memory import OomCallback

USER_FRAME = {"filename": "/job/train.py", "line": 42, "name": "train_step"}
TORCH_FRAME = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}


class FakeAllocator:
    def __init__(self, unavailable: str | None = None) -> None:
        self._unavailable = unavailable
        self.recording = False
        self.recorders = 0
        self.max_entries: int | None = None
        self.starts = 0
        self.stops = 0
        self.observers: list[OomCallback] = []
        self._events: list[dict[str, Any]] = []
        self._live: dict[int, int] = {}
        self._clock_us = 0

    def unavailable(self) -> str | None:
        return self._unavailable

    def start(self, max_entries: int) -> None:
        self.recorders += 1
        if self.recorders == 1:
            self.recording, self.max_entries = True, max_entries
        self.starts += 1

    def snapshot(self) -> dict[str, Any]:
        blocks = [{"size": size, "state": "active_allocated", "frames": [USER_FRAME]} for size in self._live.values()]
        return {
            "segments": [{"device": 0, "total_size": sum(self._live.values()), "blocks": blocks}],
            "device_traces": [list(self._events)],
        }

    def stop(self) -> None:
        self.recorders = max(0, self.recorders - 1)
        if self.recorders == 0:
            self.recording = False
            self._events.clear()
        self.stops += 1

    def observe_oom(self, callback: OomCallback) -> None:
        self.observers.append(callback)

    def _event(self, action: str, addr: int, size: int, **extra: Any) -> None:
        self._clock_us += 100
        if self.recording:
            assert self.max_entries is not None
            self._events.append(
                {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self._clock_us,
                 "frames": [TORCH_FRAME, USER_FRAME], **extra}
            )
            del self._events[: max(0, len(self._events) - self.max_entries)]

    def alloc(self, addr: int, size: int) -> None:
        self._live[addr] = size
        self._event("alloc", addr, size)

    def free(self, addr: int) -> None:
        size = self._live.pop(addr)
        self._event("free_requested", addr, size)
        self._event("free_completed", addr, size)

    def oom(self, size: int, device_free: int) -> None:
        """What torch does when an allocation fails: the observers, then the exception."""
        self._event("oom", 0, size, device_free=device_free)
        for callback in self.observers:
            callback(0, size, 80 * 2**30, device_free)
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes")
