"""The relay as a Ray actor, and how an agent finds (or starts) its node's relay.

One relay per (Ray job, node): it is created by the first agent of that job on
that node, pinned to the node, and owned by that agent's process, so it goes
away with the job. A relay costs no CPU reservation (``num_cpus=0``).
"""

from __future__ import annotations

import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.controller.handle import find_controller
from actors.relay.core import RelayCore
from orchestrator.models.agent_protocol import Command, Heartbeat, OomReport, WorkerInfo
from orchestrator.models.diagnosis import RankStacks
from orchestrator.models.profile import RankEvent
from orchestrator.settings import CONTROLLER_NAMESPACE

__all__ = ["Relay", "relay_for", "relay_name"]


class Relay:
    """The actor: every method is the :class:`RelayCore` one, served on one event loop."""

    def __init__(self, name: str, poll_timeout_s: float) -> None:
        # One id per relay instance: a relay started again under the same name (its owner's
        # process restarted) gets a link of its own, not the old one bound to the old secret.
        self._core = RelayCore(f"{name}-{uuid.uuid4().hex[:12]}", find_controller, poll_timeout_s)

    async def register(self, info: WorkerInfo, secret: str | None = None) -> str | None:
        return await self._core.register(info, secret)

    async def poll(self, heartbeat: Heartbeat, secret: str | None = None) -> Command | None:
        return await self._core.poll(heartbeat, secret)

    async def report(self, event: RankEvent, secret: str | None = None) -> None:
        await self._core.report(event, secret)

    async def stacks_reply(self, stacks: RankStacks, secret: str | None = None) -> None:
        await self._core.stacks_reply(stacks, secret)

    async def oom(self, report: OomReport, secret: str | None = None) -> None:
        await self._core.oom(report, secret)

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
