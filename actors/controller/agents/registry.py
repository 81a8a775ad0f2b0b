"""Which training workers are alive, where they are, and how to reach each one.

A worker is keyed by its agent id and belongs to a *run*: a target name plus
the Ray job (submission id, else job id) it runs in. Two live jobs that use
the same run name are two runs, listed side by side; neither evicts the
other. Within one run, a new agent on a rank replaces the old one (the
worker group restarted) and the old one is retired: if it calls again it is
told so, instead of evicting its replacement in a loop.

A worker that polls through its node's relay is linked to that relay: a
command for it wakes the relay's one long-poll, which carries the commands of
every rank on the node.

Any process in the cluster can call the controller, and agent ids are listed
by ``targets``: so each registration gets a random secret that the worker's
later calls must carry, and a relay binds its own secret to its link when it
first registers a rank. A wrong secret is refused (:class:`ForbiddenError`):
another process can neither take a worker's commands, nor speak for it, nor
re-register it elsewhere.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from actors.controller.diagnosis.health import Health
from orchestrator.build import build_id
from orchestrator.errors import ForbiddenError
from orchestrator.models.agent_protocol import Command, WorkerInfo
from orchestrator.models.control import TargetInfo, WorkerStatus

__all__ = ["Registry", "RelayLink", "Worker", "run_of"]

# Retired (and dropped) agent ids remembered; a worker group restart retires world_size of them.
_RETIRED_KEPT = 65_536
# (time, step) heartbeats kept per worker: enough to read every rank's step at one common instant.
_SAMPLES_KEPT = 4


def _same(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


@dataclass
class _Left:
    """Why and when (by the registry's clock) a worker was retired or dropped, and the commands it
    had not collected yet: a dropped worker that registers again (it had only gone silent) gets them."""

    reason: str
    at: float
    commands: list[Command] = field(default_factory=list)


def _remember(left: OrderedDict[str, _Left], agent_id: str, record: _Left) -> None:
    """Note ``record`` for ``agent_id``, newest last (so forgetting by age pops from the front)."""
    left.pop(agent_id, None)
    left[agent_id] = record
    while len(left) > _RETIRED_KEPT:
        left.popitem(last=False)


def run_of(info: WorkerInfo) -> str:
    """The run a worker belongs to within its target name: its Ray job."""
    return info.submission_id or info.ray_job_id or "local"


@dataclass
class RelayLink:
    """A node's relay: the agent ids that poll through it, and the event its long-poll waits on."""

    relay_id: str
    secret: str
    agents: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Worker:
    info: WorkerInfo
    registered_at: float
    # Issued at registration; every later call for this worker must carry it.
    secret: str
    # When the latest heartbeat was sent (dated back by a relay's hold), for step estimates
    # and sync rounds; and when the controller last heard of the worker, for expiry.
    seen_at: float
    heard_at: float = 0.0
    step: int = 0
    step_time_s: float | None = None
    # What one step is, as the agent's latest heartbeat said (its learned cycle of optimizer steps).
    step_definition: str | None = None
    # When its step count last went up (a heartbeat showed progress), and recent (time, step) heartbeats.
    advanced_at: float = 0.0
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=_SAMPLES_KEPT))
    commands: deque[Command] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    relay: RelayLink | None = None

    @property
    def run(self) -> str:
        return run_of(self.info)

    def send(self, command: Command) -> None:
        self.commands.append(command)
        self.wake.set()
        if self.relay is not None:
            self.relay.wake.set()

    def pace_s(self) -> float | None:
        """Seconds a step, the faster of the agent's own measure and the controller's last heartbeats (the sync
        round's answer among them): the agent measures none in its first second, and one over a slow start
        (imports, the first compile) is many times a step now; a lead counted in such steps passes before the
        arm lands (an Accelerate job at 15 ms a step missed its start on one rank)."""
        known = [self.step_time_s] if self.step_time_s else []
        if len(self.samples) >= 2:
            (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
            if s1 > s0 and t1 > t0:
                known.append((t1 - t0) / (s1 - s0))
        return min(known) if known else None

    def estimated_step(self, now: float) -> float:
        """Where this worker probably is now, extrapolated from its last heartbeat."""
        if not self.step_time_s:
            return float(self.step)
        return self.step + (now - self.seen_at) / self.step_time_s


class Registry:
    """Live workers by agent id; ``clock`` is injectable so tests control time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.workers: dict[str, Worker] = {}
        self.relays: dict[str, RelayLink] = {}
        # Agent id -> (why, when by the clock) of retired and of dropped workers, oldest first:
        # a dropped worker's reason is what its open windows' ranks fail with.
        self._retired: OrderedDict[str, _Left] = OrderedDict()
        self._gone: OrderedDict[str, _Left] = OrderedDict()

    def register(
        self,
        info: WorkerInfo,
        relay_id: str | None = None,
        secret: str | None = None,
        relay_secret: str | None = None,
    ) -> tuple[Worker | None, list[Worker]]:
        """Add or refresh a worker, linked to ``relay_id`` when it polls through one.
        Returns (the worker, or None when not accepted; workers it replaced).

        A retired agent is not accepted: it was replaced on its rank. A worker
        already known is refreshed only with its ``secret``; a relay's link only
        with the ``relay_secret`` it was made with (raises :class:`ForbiddenError`).
        """
        if info.agent_id in self._retired:
            return None, []
        self.check(info.agent_id, secret)
        if relay_id is not None:
            self._check_relay(relay_id, relay_secret)
        replaced = [
            w
            for agent_id, w in self.workers.items()
            if agent_id != info.agent_id
            and w.info.target == info.target
            and w.run == run_of(info)
            and w.info.world_rank == info.world_rank
        ]
        for old in replaced:
            reason = "replaced on its rank (worker group restarted)"
            self.drop(old.info.agent_id, reason)
            self._retire(old.info.agent_id, reason)
        now = self._clock()
        worker = self.workers.get(info.agent_id)
        if worker is None:
            worker = self.workers[info.agent_id] = Worker(
                info=info, registered_at=now, secret=secrets.token_urlsafe(32), seen_at=now, heard_at=now,
                advanced_at=now,
            )
            gone = self._gone.get(info.agent_id)
            if gone is not None and gone.commands:
                # It had only gone silent (dropped on expiry): what it was sent meanwhile is its still.
                worker.commands.extend(gone.commands)
                gone.commands = []
        else:
            worker.info = info
            worker.seen_at = worker.heard_at = now
        self._link(worker, relay_id, relay_secret)
        if worker.commands and worker.relay is not None:
            worker.relay.wake.set()  # carried over: the relay's long-poll takes them now
        return worker, replaced

    def check(self, agent_id: str, secret: str | None) -> Worker | None:
        """The worker ``agent_id`` when ``secret`` is its own; None when it is not registered.
        Raises :class:`ForbiddenError` for a registered worker and any other secret."""
        worker = self.workers.get(agent_id)
        if worker is not None and not _same(worker.secret, secret):
            raise ForbiddenError(f"a call for agent {agent_id[:64]} without its registration secret")
        return worker

    def relay(self, relay_id: str, relay_secret: str | None) -> RelayLink | None:
        """The link of ``relay_id`` when ``relay_secret`` is its own; None when there is none.
        Raises :class:`ForbiddenError` for any other secret."""
        self._check_relay(relay_id, relay_secret)
        return self.relays.get(relay_id)

    def _check_relay(self, relay_id: str, relay_secret: str | None) -> None:
        link = self.relays.get(relay_id)
        if relay_secret is None or (link is not None and not _same(link.secret, relay_secret)):
            raise ForbiddenError(f"a call for relay {relay_id[:64]} without its secret")

    def _link(self, worker: Worker, relay_id: str | None, relay_secret: str | None) -> None:
        if worker.relay is not None and worker.relay.relay_id != relay_id:
            self._unlink(worker)
        if relay_id is not None and relay_secret is not None and worker.relay is None:
            link = self.relays.setdefault(relay_id, RelayLink(relay_id, relay_secret))
            link.agents.add(worker.info.agent_id)
            worker.relay = link

    def _unlink(self, worker: Worker) -> None:
        link = worker.relay
        if link is None:
            return
        worker.relay = None
        link.agents.discard(worker.info.agent_id)
        if not link.agents:
            self.relays.pop(link.relay_id, None)
            link.wake.set()

    def _retire(self, agent_id: str, reason: str) -> None:
        _remember(self._retired, agent_id, _Left(reason, self._clock()))

    def why_gone(self, agent_id: str) -> str | None:
        """Why a dropped worker left, while it is remembered."""
        gone = self._gone.get(agent_id)
        return gone.reason if gone is not None else None

    def may_return(self, agent_id: str, within_s: float) -> bool:
        """Whether ``agent_id`` was dropped less than ``within_s`` ago, and not retired: a worker that
        only went silent registers again at its next call."""
        gone = self._gone.get(agent_id)
        return gone is not None and agent_id not in self._retired and self._clock() - gone.at < within_s

    def forget_left(self, before: float) -> None:
        """Forget the workers retired or dropped before ``before`` (clock time): their runs are long over."""
        for left in (self._retired, self._gone):
            while left and next(iter(left.values())).at < before:
                left.popitem(last=False)

    def heartbeat(
        self, agent_id: str, step: int, step_time_s: float | None, age_s: float = 0.0, step_definition: str | None = None
    ) -> Worker | None:
        """Record progress; ``age_s``: how long ago the worker sent it (a relay held it that long)."""
        worker = self.workers.get(agent_id)
        if worker is not None:
            worker.heard_at = self._clock()
            now = worker.heard_at - age_s
            if now < worker.seen_at:
                return worker  # older than what is known: a relay forwarded it late
            if step > worker.step or not worker.samples:
                worker.advanced_at = now
            worker.step = step
            worker.step_time_s = step_time_s
            worker.step_definition = step_definition or worker.step_definition
            worker.seen_at = now
            worker.samples.append((now, step))
        return worker

    def drop(self, agent_id: str, reason: str) -> Worker | None:
        """Forget a worker, remembering why; wakes its outstanding poll so it returns at once."""
        worker = self.workers.pop(agent_id, None)
        if worker is not None:
            self._unlink(worker)
            worker.wake.set()
            _remember(self._gone, agent_id, _Left(reason, self._clock(), list(worker.commands)))
        return worker

    def send(self, agent_id: str, command: Command) -> None:
        """Send ``command`` to ``agent_id``: a live worker now; a dropped one when it registers again
        (it may only have gone silent); a retired or forgotten one never (it does not come back)."""
        worker = self.workers.get(agent_id)
        if worker is not None:
            worker.send(command)
        elif (gone := self._gone.get(agent_id)) is not None and agent_id not in self._retired:
            gone.commands.append(command)

    def expired(self, expiry_s: float) -> list[Worker]:
        """Workers not heard of for longer than ``expiry_s``."""
        now = self._clock()
        return [w for w in self.workers.values() if now - w.heard_at > expiry_s]

    def names(self) -> list[str]:
        return sorted({w.info.target for w in self.workers.values()})

    def runs(self, target: str) -> dict[str, dict[int, Worker]]:
        """Live runs of ``target``, newest first (by first registration), each rank -> worker."""
        by_run: dict[str, dict[int, Worker]] = {}
        for w in self.workers.values():
            if w.info.target == target:
                by_run.setdefault(w.run, {})[w.info.world_rank] = w
        return dict(sorted(by_run.items(), key=lambda kv: -min(w.registered_at for w in kv[1].values())))

    def run_workers(self, target: str, run: str | None) -> dict[int, Worker]:
        """Rank -> worker of one run of ``target``: the named one, else the newest."""
        runs = self.runs(target)
        if run is not None:
            return runs.get(run, {})
        return next(iter(runs.values()), {})

    def infos(self, target: str) -> Iterable[WorkerInfo]:
        return (w.info for w in self.workers.values() if w.info.target == target)

    def target_infos(
        self,
        active: dict[str, str],
        queued: dict[str, list[str]],
        health: Callable[[dict[int, Worker]], Health],
        stall_stacks: dict[tuple[str, str], tuple[str, str]],
    ) -> list[TargetInfo]:
        """Every live run, grouped by target name, newest run first, with its health."""
        now = self._clock()
        found: list[TargetInfo] = []
        for name in self.names():
            for run, workers in self.runs(name).items():
                ranks = [workers[r] for r in sorted(workers)]
                h = health(workers)
                stall = stall_stacks.get((name, run))
                found.append(
                    TargetInfo(
                        name=name,
                        run=run,
                        world_size=max(w.info.world_size for w in ranks),
                        ranks=[
                            WorkerStatus(
                                info=w.info,
                                step=w.step,
                                step_time_s=w.step_time_s,
                                step_definition=w.step_definition,
                                last_seen_s=now - w.seen_at,
                                advanced_s=now - w.advanced_at,
                                steps_behind=h.behind.get(w.info.world_rank),
                            )
                            for w in ranks
                        ],
                        active_profile=active.get(name),
                        queued_profiles=list(queued.get(name, [])),
                        health="STALLED" if h.stalled else "TRAINING",
                        stalled_s=h.stalled_s if h.stalled else None,
                        stall_threshold_s=h.threshold_s,
                        median_step_time_s=h.median_step_s,
                        lagging_ranks=h.lagging,
                        stall_stacks=stall[0] if stall else None,
                        stall_verdict=stall[1] if stall else None,
                        other_build_ranks=[w.info.world_rank for w in ranks if w.info.build != build_id()],
                    )
                )
        return found
