"""Progress lines while a profile runs, and the sizes and step counts they show."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from orchestrator.cli.terminal import printable
from orchestrator.client import ProfilingClient
from orchestrator.errors import (
    RayprofError,
)
from orchestrator.models.profile import ProfileStatus, RankResult
from orchestrator.models.requests import ProfileState, RankState

__all__ = ["ProgressPrinter", "current_steps_lookup", "format_progress", "format_size", "steps_captured", "window_steps"]


class ProgressPrinter:
    """Prints one line per change while a profile runs: state, then per rank
    its state, steps captured and bytes uploaded.

    ``current_steps`` returns each rank's training step (from ``targets()``)
    to show progress inside the window; it is only asked while capturing.
    """

    def __init__(
        self, current_steps: Callable[[str], dict[int, int]] | None = None, stream: TextIO | None = None
    ) -> None:
        self._current_steps = current_steps
        self._stream = stream or sys.stderr
        self._started = time.monotonic()
        self._last = ""

    def __call__(self, status: ProfileStatus) -> None:
        steps_now: dict[int, int] = {}
        if self._current_steps is not None and status.state == ProfileState.CAPTURING:
            try:
                steps_now = self._current_steps(status.target)
            except RayprofError:
                steps_now = {}  # progress display only: never fail the wait for it
        line = format_progress(status, steps_now)
        if line != self._last:
            self._last = line
            print(f"[{time.monotonic() - self._started:6.1f}s] {printable(line)}", file=self._stream, flush=True)


def format_progress(status: ProfileStatus, steps_now: dict[int, int] | None = None) -> str:
    """``CAPTURING start step 120 | rank0 CAPTURING 2/5 steps 0 B | rank1 ...``."""
    head = status.state.value
    if status.start_step is not None:
        head += f" start step {status.start_step}"
    parts = [head]
    for rank in status.ranks:
        captured = steps_captured(rank, status, (steps_now or {}).get(rank.rank))
        part = f"rank{rank.rank} {rank.state.value} {captured}/{window_steps(status)} steps {format_size(rank.bytes_uploaded)}"
        if rank.reason and rank.state in (RankState.FAILED, RankState.CANCELLED):
            part += f" ({printable(rank.reason)})"
        parts.append(part)
    return " | ".join(parts)


def window_steps(status: ProfileStatus) -> int:
    """Steps in the window as planned: fewer than asked when the byte cap shortened it."""
    if status.start_step is not None and status.stop_step is not None:
        return status.stop_step - status.start_step
    return status.request.steps if status.request is not None else 0


def steps_captured(rank: RankResult, status: ProfileStatus, step_now: int | None) -> int:
    steps = window_steps(status)
    if rank.first_step is not None and rank.last_step is not None:
        return rank.last_step - rank.first_step + 1
    if rank.state == RankState.UPLOADING:
        return steps
    if rank.state == RankState.CAPTURING and step_now is not None and status.start_step is not None:
        return max(0, min(steps, step_now - status.start_step))
    return 0


def format_size(n: int) -> str:
    """Bytes as B, KB, MB or GB."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def current_steps_lookup(client: ProfilingClient) -> Callable[[str], dict[int, int]]:
    """A lookup of each rank's current training step for :class:`ProgressPrinter`."""

    def lookup(target: str) -> dict[int, int]:
        for info in client.targets():
            if info.name == target:
                return {w.info.world_rank: w.step for w in info.ranks}
        return {}

    return lookup


