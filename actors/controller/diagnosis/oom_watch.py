"""What an ``oom`` watch needs beyond the other conditions: which ranks record the CUDA
allocator's history, and the out-of-memory errors reported since.

An OOM is an event, the other conditions are states: a rank's :class:`OomReport` is latched
here per target (the latest), and the watch's condition holds while a report is newer than
the watch's last firing; the watch's cooldown and hourly cap then bound the bundles as they
bound every action. Recording follows the watches: every live worker of a target that an
``oom`` watch names is told to record, and told to stop once no watch names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from actors.controller.agents.registry import Registry, Worker
from orchestrator.models.agent_protocol import MemoryHistoryCommand, OomReport
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.profile import OutOfMemory

__all__ = ["OomEvents"]

_MIB = 2**20


@dataclass(frozen=True)
class _Latched:
    at: datetime  # when the controller heard of it, on the watches' clock
    run: str
    oom: OutOfMemory


class OomEvents:
    """The latest out-of-memory report of each target, and who is told to record."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._latest: dict[str, _Latched] = {}
        # Workers told to record (by agent id): told once, not on every tick.
        self._recording: set[str] = set()

    def report(self, worker: Worker, report: OomReport, at: datetime) -> None:
        """A rank of ``worker``'s run ran out of CUDA memory."""
        oom = OutOfMemory(
            rank=worker.info.world_rank, device=report.device, asked_bytes=report.asked_bytes,
            limit_bytes=report.limit_bytes, free_bytes=report.free_bytes,
        )
        self._latest[worker.info.target] = _Latched(at=at, run=worker.run, oom=oom)

    def condition(self, spec: WatchSpec, last_fired: datetime | None) -> tuple[bool, dict[str, Any]]:
        """Whether ``spec``'s target reported an OOM since ``last_fired``, and the trigger's fields."""
        latched = self._latest.get(spec.target)
        if latched is None or (last_fired is not None and latched.at <= last_fired):
            return False, {}
        oom = latched.oom
        return True, dict(
            kind="oom",
            observed=float(oom.asked_bytes),
            threshold=float(oom.free_bytes),
            oom=oom,
            detail=f"rank {oom.rank} ran out of CUDA memory on cuda:{oom.device}: asked for "
            f"{oom.asked_bytes / _MIB:,.1f} MiB with {oom.free_bytes / _MIB:,.1f} MiB free "
            f"of {oom.limit_bytes / _MIB:,.1f} MiB",
        )

    def sync(self, watches: Iterable[WatchSpec]) -> None:
        """Tell every live worker of a watched target to record, and every other one that was told, to stop."""
        watched = {spec.target for spec in watches if spec.oom}
        if not watched and not self._recording:
            return
        live = self._registry.workers
        for agent_id, worker in live.items():
            wanted = worker.info.target in watched
            if wanted != (agent_id in self._recording):
                worker.send(MemoryHistoryCommand(record=wanted))
                (self._recording.add if wanted else self._recording.discard)(agent_id)
        self._recording &= set(live)

    def forget(self, targets: Iterable[str]) -> None:
        """Drop what is kept of targets gone for good."""
        for target in targets:
            self._latest.pop(target, None)
