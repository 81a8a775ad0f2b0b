"""The agent side of the control actor: registration, the long-poll (also the heartbeat),
rank reports, and dropping workers that went silent.

Agents call these directly, or through their node's relay (``actors.relay``),
which polls with ``poll_node`` for all its ranks and sends their events in
batches with ``report_many``: then the controller answers nodes, not ranks.

``register`` answers a secret that the worker's later calls carry (a relay's
calls carry the secret it registered its ranks with): see
:mod:`actors.controller.agents.registry`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from actors.controller.agents.registry import Registry, Worker
from actors.controller.diagnosis.stacks_bundle import StacksTaker
from actors.controller.diagnosis.watches import Watches
from actors.controller.live_config import LiveConfig
from actors.controller.profiles.state import Profile, wait_event
from actors.controller.saved.persistence import Persistence
from orchestrator.models.agent_protocol import (
    CancelCommand,
    Command,
    Heartbeat,
    NodePoll,
    NodeReply,
    OomReport,
    RegisterCommand,
    WorkerInfo,
)
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import RankStacks
from orchestrator.models.profile import RankEvent
from orchestrator.models.requests import RankState
from orchestrator.ray_compat import actor_death

__all__ = ["AgentSide", "ActorDeaths", "deaths_in_ray"]

logger = logging.getLogger(__name__)

# How long the reaper waits for Ray's word on the actors of the workers it drops.
_ASK_RAY_S = 10.0

ActorDeaths = Callable[[list[str]], dict[str, str]]
"""Ray's words for why each of these actors ended, for those its GCS holds dead (a seam: tests run without Ray)."""


def deaths_in_ray(actor_ids: list[str]) -> dict[str, str]:
    """:data:`ActorDeaths` from the connected cluster's GCS, one call per actor; if the GCS cannot be asked, the
    rest are left out (their workers are then told silent, as before the GCS was asked)."""
    found: dict[str, str] = {}
    for actor_id in actor_ids:
        try:
            why = actor_death(actor_id)
        except Exception as e:
            logger.info("rayprof controller: cannot ask Ray why actor %s ended (%s: %.200s)", actor_id, type(e).__name__, e)
            break
        if why is not None:
            found[actor_id] = why
    return found


class AgentSide:
    """Methods agents call; mixed into :class:`actors.controller.actor.Controller`."""

    _settings: LiveConfig
    _registry: Registry
    _persistence: Persistence
    _profiles: dict[str, Profile]
    _stacks: StacksTaker
    _watches: Watches
    _actor_deaths: ActorDeaths

    async def _ensure_started(self) -> None:
        raise NotImplementedError

    async def register(
        self,
        info: WorkerInfo,
        relay_id: str | None = None,
        secret: str | None = None,
        relay_secret: str | None = None,
    ) -> str | None:
        """An agent announces itself (``relay_id``: the relay it polls through, with the relay's
        ``relay_secret``); ``secret``: the one it got when it registered before, if it did.
        Returns the secret its later calls must carry; None: it was replaced on its rank
        and must stop calling."""
        await self._ensure_started()
        worker, replaced = self._registry.register(info, relay_id, secret, relay_secret)
        for old in replaced:
            self._worker_gone(old.info.agent_id, "the worker was replaced (worker group restarted)")
        if worker is None:
            return None
        for profile in self._profiles.values():
            rank = info.world_rank
            same_run = profile.run is None or profile.run == self._registry.workers[info.agent_id].run
            if profile.target == info.target and same_run and not profile.state.is_terminal and rank in profile.ranks:
                profile.agents.setdefault(rank, info.agent_id)
        logger.info("rayprof controller: registered %s rank %d (%s)", info.target, info.world_rank, info.host)
        return worker.secret

    async def poll(self, heartbeat: Heartbeat, secret: str | None = None) -> Command | None:
        """Long-poll: record progress, then wait for a command up to the poll timeout."""
        await self._ensure_started()
        if self._registry.check(heartbeat.agent_id, secret) is None:
            return RegisterCommand()
        worker = self._registry.heartbeat(
            heartbeat.agent_id, heartbeat.step, heartbeat.step_time_s, step_definition=heartbeat.step_definition
        )
        if worker is None:
            return RegisterCommand()
        if not worker.commands:
            worker.wake.clear()
            await wait_event(worker.wake, self._settings().poll_timeout_s)
        if worker.commands and self._registry.workers.get(heartbeat.agent_id) is worker:
            return worker.commands.popleft()
        return None

    async def poll_node(self, poll: NodePoll, relay_secret: str | None = None) -> NodeReply:
        """A relay's long-poll for its node: record the progress of every rank linked to it,
        then wait for a command for any of them, up to the poll timeout."""
        await self._ensure_started()
        reply = NodeReply()
        link = self._registry.relay(poll.relay_id, relay_secret)
        for beat in poll.beats:
            hb = beat.heartbeat
            if hb.agent_id not in self._registry.workers:
                reply.commands[hb.agent_id] = [RegisterCommand()]
            elif link is not None and hb.agent_id in link.agents:
                self._registry.heartbeat(hb.agent_id, hb.step, hb.step_time_s, beat.age_s, hb.step_definition)
            # else: a rank registered through another relay (or none): not this relay's to speak for.
        if link is None:
            return reply
        workers = self._registry.workers

        def waiting() -> bool:
            return any(workers[a].commands for a in link.agents if a in workers)

        if not reply.commands and not waiting():
            link.wake.clear()
            await wait_event(link.wake, self._settings().poll_timeout_s)
        for agent_id in list(link.agents):
            worker = workers.get(agent_id)
            if worker is not None and worker.commands:
                reply.commands[agent_id] = list(worker.commands)
                worker.commands.clear()
        return reply

    async def report(self, event: RankEvent, secret: str | None = None) -> None:
        """An agent's window changed state. A rank's final result is saved before this returns:
        the agent drops it once acknowledged, and resends it when this raises."""
        await self._ensure_started()
        self._registry.check(event.agent_id, secret)
        await self._apply_all([event])

    async def report_many(
        self, events: list[RankEvent], relay_id: str | None = None, relay_secret: str | None = None
    ) -> None:
        """Events of a relay's ranks in one call (its batch), applied in order; each profile
        that got a final result is saved once, before this returns. Events of ranks not
        linked to the relay are dropped."""
        await self._ensure_started()
        link = self._registry.relay(relay_id or "", relay_secret)
        await self._apply_all([e for e in events if link is not None and e.agent_id in link.agents])

    async def _apply_all(self, events: list[RankEvent]) -> None:
        to_save: dict[str, Profile] = {}
        for event in events:
            profile = self._apply(event)
            if profile is not None:
                to_save[profile.id] = profile
        for profile in to_save.values():
            await self._persistence.save(profile)

    def _apply(self, event: RankEvent) -> Profile | None:
        """Record one event; returns the profile when it must be saved before acknowledging."""
        profile = self._profiles.get(event.profile_id)
        worker = self._registry.workers.get(event.agent_id)
        if worker is None:
            return None
        if not isinstance(profile, Profile) or profile.state.is_terminal:  # a bundle has no window
            self._drop_stray_window(worker, event)
            return None
        rank = worker.info.world_rank
        current = profile.ranks.get(rank)
        # Only the agent the rank's window was armed on speaks for it: another run's worker with the
        # same target name and rank (or a replaced one) must not end this run's rank.
        if worker.info.target != profile.target or current is None or profile.agents.get(rank) != event.agent_id:
            return None
        if current.state.is_terminal:
            self._drop_stray_window(worker, event)
            return profile if event.state.is_terminal else None  # a resend after a failed save
        # When it happened on the rank, by its clock: hearing of it comes a relay batch later
        # (seconds at 1,000+ ranks). Never later than now, so a clock running ahead cannot
        # stretch the next window's lead, which is sized from the last arm round.
        at = min(event.at, utcnow()) if event.at is not None else utcnow()
        update: dict[str, Any] = {"state": event.state, "reason": event.reason}
        if event.state == RankState.ARMED:
            update["armed_at"] = at
        elif event.state == RankState.CAPTURING:
            update["capture_started_at"] = at
            profile.capture_started_at = min(profile.capture_started_at or at, at)
        elif event.state == RankState.UPLOADING:
            update["capture_ended_at"] = at
        if event.state.is_terminal:
            update.update(event.outcome(), finished_at=at)
            # What one step is, as the rank says it now: a window planned while its agent was still learning the
            # cycle of optimizer steps ("... (learning the cycle ...)") ran its steps once it knew.
            update["step_definition"] = worker.step_definition or current.step_definition
        profile.ranks[rank] = current.model_copy(update=update)
        if event.state in (RankState.FAILED, RankState.CANCELLED):
            logger.info("rayprof controller: %s rank %d %s: %s", profile.id, rank, event.state.value, event.reason)
        profile.changed.set()
        return profile if event.state.is_terminal else None

    @staticmethod
    def _drop_stray_window(worker: Worker, event: RankEvent) -> None:
        """A window still open for a profile that has ended on this rank: it would make the
        rank refuse every later window until it closed, so the rank is told to drop it."""
        if event.state in (RankState.ARMED, RankState.CAPTURING):
            worker.send(CancelCommand(profile_id=event.profile_id))

    async def stacks_reply(self, stacks: RankStacks, secret: str | None = None) -> None:
        """An agent's answer to a ``stacks`` command."""
        await self._ensure_started()
        if self._registry.check(stacks.agent_id, secret) is not None:
            await self._stacks.receive(stacks)

    async def oom(self, report: OomReport, secret: str | None = None) -> None:
        """A rank recording for an OOM watch ran out of CUDA memory (sent at once, not with a poll):
        the watch fires on the next monitor tick, while the failing rank holds for its snapshot."""
        await self._ensure_started()
        worker = self._registry.check(report.agent_id, secret)
        if worker is not None:
            logger.info(
                "rayprof controller: %s rank %d ran out of CUDA memory (asked %d bytes, %d free)",
                worker.info.target, worker.info.world_rank, report.asked_bytes, report.free_bytes,
            )
            self._watches.oom.report(worker, report, self._watches.clock.wall())

    def _worker_gone(self, agent_id: str, reason: str) -> None:
        logger.info("rayprof controller: dropped agent %s: %s", agent_id, reason)
        for profile in self._profiles.values():
            if isinstance(profile, Profile) and not profile.state.is_terminal and agent_id in profile.agents.values():
                profile.changed.set()

    async def _reap_workers(self) -> None:
        expiry = self._settings().poll_timeout_s + self._settings().worker_expiry_grace_s
        while True:
            await asyncio.sleep(min(1.0, expiry / 4))
            expired = self._registry.expired(expiry)
            if not expired:
                continue
            silent = {w.info.agent_id for w in expired}
            deaths = await self._deaths([a for w in expired if (a := w.info.actor_id)])
            for worker in expired:
                death = deaths.get(worker.info.actor_id or "")
                reason = _actor_ended(death) if death is not None else self._silence(worker, silent, expiry)
                self._registry.drop(worker.info.agent_id, reason)
                self._worker_gone(worker.info.agent_id, reason)

    async def _deaths(self, actor_ids: list[str]) -> dict[str, str]:
        """Ray's words for those of these actors it holds dead: off the event loop (when a run of a thousand ranks
        ends, Ray is asked about each), and bounded, so that a GCS that does not answer delays no reaping."""
        if not actor_ids:
            return {}
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._actor_deaths, actor_ids), _ASK_RAY_S)
        except asyncio.TimeoutError:
            logger.info("rayprof controller: Ray did not say within %gs why %d actors ended", _ASK_RAY_S, len(actor_ids))
            return {}

    def _silence(self, worker: Worker, silent: set[str], expiry: float) -> str:
        """Why a worker went silent while Ray does not hold its actor dead: a host whose workers all
        stopped at once has most likely dropped off the network (or is down); a worker whose
        neighbours on the same host still answer has exited or hung on its own."""
        node = worker.info.node_id
        answering = any(w.info.node_id == node and a not in silent for a, w in self._registry.workers.items())
        if answering:
            return (
                f"no heartbeat for over {expiry:.0f}s while other workers on host {worker.info.host} "
                "still answer: its process exited or hung"
            )
        return (
            f"host {worker.info.host} stopped answering: no heartbeat from it for over {expiry:.0f}s "
            "(the host or its network is down, or its process exited)"
        )


def _actor_ended(death: str) -> str:
    """A silent worker whose actor Ray holds dead, said in Ray's words (killed, exited, crashed, its node died): no
    host or network is blamed for a run that ended. Ray Train ends a run's workers with ray.kill (Train v2) or by
    asking them to exit (v1)."""
    why = death.strip().rstrip(".") or "no cause given"
    note = "; Ray Train ends a run's workers so when the run finishes, fails or is stopped" if "ray.kill" in death else ""
    return f"Ray holds its actor dead ({why[:300]}){note}"
