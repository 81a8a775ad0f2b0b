"""The relay's logic, free of the actor around it, so simulated nodes can run it in process.

Agents call :meth:`RelayCore.register`, :meth:`poll`, :meth:`report` and
:meth:`stacks_reply` exactly as they would call the controller. Upstream, one
node loop long-polls the controller with every local rank's latest heartbeat
(dated by its age, so the controller's step estimates stay right) and hands
the commands it gets to the ranks they are for. Events are batched: while one
``report_many`` is in flight, the next batch gathers; each rank's ``report``
returns only once its batch was acknowledged, so a result is still saved
before the rank drops it.

Any process can find a relay by its name and call it: a rank's calls carry the
secret the controller issued when the rank registered (the relay passes it
through and keeps it), and the relay's own calls carry a secret it draws at
start, which its link at the controller is bound to.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from actors.controller.profiles.state import wait_event
from actors.upstream import RelayUpstreamRpc
from orchestrator.errors import ForbiddenError
from orchestrator.models.agent_protocol import (
    Command,
    Heartbeat,
    NodeBeat,
    NodePoll,
    NodeReply,
    OomReport,
    RegisterCommand,
    WorkerInfo,
)
from orchestrator.models.diagnosis import RankStacks
from orchestrator.models.profile import RankEvent

__all__ = ["RelayCore", "RelayError"]

logger = logging.getLogger(__name__)

# After handing out commands, how long the node loop waits for those ranks to poll
# again: a sync round wants their step counts as of now, in the next node poll.
_REPOLL_WAIT_S = 0.1
# Pauses before trying the controller again after failed node polls: the first retry is at
# once (a restarted controller answers it, and its ranks re-register), then backing off.
_RETRY_S = (0.0, 0.25, 0.5, 1.0, 2.0)

T = TypeVar("T")
P = ParamSpec("P")


class RelayError(RuntimeError):
    """The controller could not be reached for a rank's call; the agent retries."""


@dataclass
class _Local:
    """One rank on this node, as the relay knows it."""

    secret: str
    beat: Heartbeat | None = None
    beat_at: float = 0.0
    polling: bool = False
    commands: deque[Command] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RelayCore:
    """Multiplexes one node's agents onto one long-poll; ``find_controller`` returns a handle or ``None``.

    It serves :class:`actors.upstream.AgentUpstream` to its agents and calls
    :class:`actors.upstream.RelayUpstream` at the controller."""

    def __init__(
        self,
        relay_id: str,
        find_controller: Callable[[], Any],
        poll_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.relay_id = relay_id
        # Binds this relay's link at the controller: a process that names this relay_id cannot poll for it.
        self._secret = secrets.token_urlsafe(32)
        self._find = find_controller
        self._poll_timeout_s = poll_timeout_s
        self._clock = clock
        self._controller: RelayUpstreamRpc | None = None
        self._locals: dict[str, _Local] = {}
        self._node_loop: asyncio.Task | None = None
        self._repolled = asyncio.Event()
        self._batch: list[tuple[RankEvent, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.upstream_calls = {"poll_node": 0, "report_many": 0, "register": 0, "stacks_reply": 0, "report": 0, "oom": 0}

    def _upstream(self) -> RelayUpstreamRpc:
        if self._controller is None:
            handle = self._find()
            if handle is None:
                raise RelayError("no rayprof controller is running")
            self._controller = RelayUpstreamRpc(handle)
        return self._controller

    async def _call(
        self, method: Callable[Concatenate[RelayUpstreamRpc, P], Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """One call to the controller: ``method`` of :class:`RelayUpstreamRpc`, counted by its name."""
        name = method.__name__
        self.upstream_calls[name] += 1
        try:
            return await method(self._upstream(), *args, **kwargs)
        except RelayError:
            raise
        except Exception as e:
            # The controller restarted or died: find it again on the next call.
            self._controller = None
            raise RelayError(f"controller call {name} failed: {type(e).__name__}: {str(e)[:200]}") from e

    async def register(self, info: WorkerInfo, secret: str | None = None) -> str | None:
        """Register a local agent with the controller, linked to this relay; returns the
        agent's secret (None: replaced on its rank, stop). ``secret``: the agent's from before."""
        issued = await self._call(
            RelayUpstreamRpc.register, info, relay_id=self.relay_id, secret=secret, relay_secret=self._secret
        )
        if issued is not None:
            local = self._locals.get(info.agent_id)
            if local is None or local.secret != issued:
                local = self._locals[info.agent_id] = _Local(secret=issued)
            local.beat_at = self._clock()
            self._ensure_node_loop()
        return issued

    def _local(self, agent_id: str, secret: str | None) -> _Local | None:
        """The local rank ``agent_id`` when ``secret`` is its own; None when it is not known here."""
        local = self._locals.get(agent_id)
        if local is not None and (secret is None or not hmac.compare_digest(local.secret.encode(), secret.encode())):
            raise ForbiddenError(f"a call for agent {agent_id[:64]} without its registration secret")
        return local

    async def poll(self, heartbeat: Heartbeat, secret: str | None = None) -> Command | None:
        """A local agent's long-poll: its heartbeat goes up with the next node poll."""
        local = self._local(heartbeat.agent_id, secret)
        if local is None:
            # Not registered through this relay (it restarted, or forgot a silent rank).
            return RegisterCommand()
        local.beat, local.beat_at, local.polling = heartbeat, self._clock(), True
        self._repolled.set()
        self._ensure_node_loop()
        try:
            if not local.commands:
                local.wake.clear()
                await wait_event(local.wake, self._poll_timeout_s)
            return local.commands.popleft() if local.commands else None
        finally:
            local.polling = False

    async def report(self, event: RankEvent, secret: str | None = None) -> None:
        """A local rank's event; returns once the controller acknowledged the batch it rode in."""
        if self._local(event.agent_id, secret) is None:
            # Not known here (this relay restarted): the controller checks the rank's own secret.
            await self._call(RelayUpstreamRpc.report, event, secret)
            return
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batch.append((event, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        await done

    async def stacks_reply(self, stacks: RankStacks, secret: str | None = None) -> None:
        await self._call(RelayUpstreamRpc.stacks_reply, stacks, secret)

    async def oom(self, report: OomReport, secret: str | None = None) -> None:
        """A local rank ran out of CUDA memory: straight up, not batched (the bundle is urgent)."""
        await self._call(RelayUpstreamRpc.oom, report, secret)

    async def _flush(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            try:
                events = [event for event, _ in batch]
                await self._call(RelayUpstreamRpc.report_many, events, self.relay_id, self._secret)
            except RelayError as e:
                for _, done in batch:
                    done.set_exception(e)
            else:
                for _, done in batch:
                    done.set_result(None)

    def _ensure_node_loop(self) -> None:
        if self._node_loop is None or self._node_loop.done():
            self._node_loop = asyncio.get_running_loop().create_task(self._run_node_loop())

    def _forget_silent(self, now: float) -> None:
        """Drop ranks that stopped polling (their process is gone): forwarding their last heartbeat
        would keep them alive at the controller. A live rank polls again within milliseconds."""
        limit = self._poll_timeout_s + 2
        for agent_id in [a for a, local in self._locals.items() if not local.polling and now - local.beat_at > limit]:
            del self._locals[agent_id]

    async def _run_node_loop(self) -> None:
        failures = 0
        while self._locals:
            now = self._clock()
            self._forget_silent(now)
            beats = [
                NodeBeat(heartbeat=local.beat, age_s=max(0.0, now - local.beat_at))
                for local in self._locals.values()
                if local.beat is not None
            ]
            try:
                poll = NodePoll(relay_id=self.relay_id, beats=beats)
                reply = await self._call(RelayUpstreamRpc.poll_node, poll, self._secret)
            except RelayError as e:
                logger.warning("rayprof relay %s: %s; retrying", self.relay_id, e)
                await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                failures += 1
                continue
            failures = 0
            await self._deliver(reply)

    async def _deliver(self, reply: NodeReply) -> None:
        delivered_at = self._clock()
        given: list[_Local] = []
        for agent_id, commands in reply.commands.items():
            local = self._locals.get(agent_id)
            if local is not None:
                local.commands.extend(commands)
                local.wake.set()
                given.append(local)
        deadline = delivered_at + _REPOLL_WAIT_S
        while any(local.beat_at < delivered_at for local in given) and (left := deadline - self._clock()) > 0:
            self._repolled.clear()
            await wait_event(self._repolled, left)
