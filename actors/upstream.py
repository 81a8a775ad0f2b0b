"""The agent side's one RPC, typed: what an agent calls upstream, and what a relay calls at the controller.

An agent calls :class:`AgentUpstream`, served alike by the controller (``actors.controller.agents.agent_side``)
and by its node's relay (``actors.relay``); a relay calls :class:`RelayUpstream` at the controller: the
same calls, with its own id and secret on ``register``, plus the node's ``poll_node`` and
``report_many``. ``tests/unit/test_upstream.py`` checks that both servers' methods match these signatures.

Over Ray, :class:`AgentUpstreamRpc` and :class:`RelayUpstreamRpc` send each call through an actor
handle and return its ``ObjectRef`` (as :class:`actors.controller.rpc.ControllerRpc` does for clients),
so no caller names a remote method by a string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.models.agent_protocol import Command, Heartbeat, NodePoll, NodeReply, OomReport, WorkerInfo
from orchestrator.models.diagnosis import RankStacks
from orchestrator.models.profile import RankEvent

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["AgentUpstream", "AgentUpstreamRpc", "RelayUpstream", "RelayUpstreamRpc"]


def _send(method: Any, **arguments: Any) -> ObjectRef[Any]:
    """``method.remote(...)``: the one untyped step (an actor handle's methods are ``Any`` to a type checker).

    By keyword only: a process that imported the control actor's module before it was upgraded (a job's workers,
    its relays) checks a call against the signatures of that module's class, and Ray gives every method of an actor
    whose class has since changed the signature ``(**kwargs)`` there (read off Ray 2.60's handles): an argument by
    position was refused in the caller ("too many positional arguments"), so the agents of every job started
    before an upgrade that added a method could never register again."""
    ref: ObjectRef[Any] = method.remote(**arguments)
    return ref


class AgentUpstream(Protocol):
    """Every call an agent makes upstream. Each but ``register`` carries the secret ``register`` answered."""

    async def register(self, info: WorkerInfo, *, secret: str | None = None) -> str | None:
        """Announce the worker (``secret``: the one it got before); the secret of its later calls,
        or None: it was replaced on its rank and must stop."""

    async def poll(self, heartbeat: Heartbeat, secret: str | None = None) -> Command | None:
        """The long-poll, also the heartbeat: the next command, or None at the poll timeout."""

    async def report(self, event: RankEvent, secret: str | None = None) -> None:
        """A window's state changed on the rank; returns once a final result is saved."""

    async def stacks_reply(self, stacks: RankStacks, secret: str | None = None) -> None:
        """The answer to a ``stacks`` command."""

    async def oom(self, report: OomReport, secret: str | None = None) -> None:
        """The rank ran out of CUDA memory while recording for an OOM watch (sent at once)."""


class RelayUpstream(AgentUpstream, Protocol):
    """What a relay calls at the controller: its agents' calls (``register`` linking the agent to the
    relay), and its node's long-poll and event batches, which carry the relay's own secret."""

    async def register(
        self,
        info: WorkerInfo,
        relay_id: str | None = None,
        secret: str | None = None,
        relay_secret: str | None = None,
    ) -> str | None:
        """``register`` of the agent ``info``, polling through relay ``relay_id``."""

    async def poll_node(self, poll: NodePoll, relay_secret: str | None = None) -> NodeReply:
        """The long-poll for every rank on the node; the commands for them by agent id."""

    async def report_many(
        self, events: list[RankEvent], relay_id: str | None = None, relay_secret: str | None = None
    ) -> None:
        """The node's ranks' events, in order; returns once every final result among them is saved."""


class AgentUpstreamRpc:
    """:class:`AgentUpstream` through a Ray actor handle (the controller's or a relay's)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def register(self, info: WorkerInfo, *, secret: str | None = None) -> ObjectRef[str | None]:
        return _send(self.handle.register, info=info, secret=secret)

    def poll(self, heartbeat: Heartbeat, secret: str | None = None) -> ObjectRef[Command | None]:
        return _send(self.handle.poll, heartbeat=heartbeat, secret=secret)

    def report(self, event: RankEvent, secret: str | None = None) -> ObjectRef[None]:
        return _send(self.handle.report, event=event, secret=secret)

    def stacks_reply(self, stacks: RankStacks, secret: str | None = None) -> ObjectRef[None]:
        return _send(self.handle.stacks_reply, stacks=stacks, secret=secret)

    def oom(self, report: OomReport, secret: str | None = None) -> ObjectRef[None]:
        return _send(self.handle.oom, report=report, secret=secret)


class RelayUpstreamRpc(AgentUpstreamRpc):
    """:class:`RelayUpstream` through the controller's actor handle."""

    def register(
        self,
        info: WorkerInfo,
        relay_id: str | None = None,
        secret: str | None = None,
        relay_secret: str | None = None,
    ) -> ObjectRef[str | None]:
        return _send(self.handle.register, info=info, relay_id=relay_id, secret=secret, relay_secret=relay_secret)

    def poll_node(self, poll: NodePoll, relay_secret: str | None = None) -> ObjectRef[NodeReply]:
        return _send(self.handle.poll_node, poll=poll, relay_secret=relay_secret)

    def report_many(
        self, events: list[RankEvent], relay_id: str | None = None, relay_secret: str | None = None
    ) -> ObjectRef[None]:
        return _send(self.handle.report_many, events=events, relay_id=relay_id, relay_secret=relay_secret)
