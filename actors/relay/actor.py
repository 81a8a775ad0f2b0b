"""The relay as a Ray actor, and how an agent finds (or starts) its node's relay.

One relay per (Ray job, node): it is created by the first agent of that job on
that node, pinned to the node, and owned by that agent's process, so it goes
away with the job. A relay costs no CPU reservation (``num_cpus=0``).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.controller.handle import find_controller
from actors.relay.core import RelayCore
from orchestrator.diagnosis import RankStacks
from orchestrator.models import Command, Heartbeat, RankEvent, WorkerInfo
from orchestrator.settings import CONTROLLER_NAMESPACE

__all__ = ["Relay", "relay_for", "relay_name"]


class Relay:
    """The actor: every method is the :class:`RelayCore` one, served on one event loop."""

    def __init__(self, relay_id: str, poll_timeout_s: float) -> None:
        self._core = RelayCore(relay_id, find_controller, poll_timeout_s)

    async def register(self, info: WorkerInfo) -> bool:
        return await self._core.register(info)

    async def poll(self, heartbeat: Heartbeat) -> Command | None:
        return await self._core.poll(heartbeat)

    async def report(self, event: RankEvent) -> None:
        await self._core.report(event)

    async def stacks_reply(self, stacks: RankStacks) -> None:
        await self._core.stacks_reply(stacks)

    async def counters(self) -> dict[str, int]:
        return dict(self._core.upstream_calls)


def relay_name(info: WorkerInfo) -> str:
    return f"rayprof-relay-{info.submission_id or info.ray_job_id or 'local'}-{info.node_id}"


def relay_for(info: WorkerInfo, poll_timeout_s: float) -> Any:
    """The handle of this worker's node relay, started if it is not running yet."""
    name = relay_name(info)
    return (
        ray.remote(Relay)
        .options(
            name=name,
            namespace=CONTROLLER_NAMESPACE,
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=1_000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=info.node_id, soft=False),
        )
        .remote(name, poll_timeout_s)
    )
