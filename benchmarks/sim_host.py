"""Simulated ranks for the control-plane benchmark and the scale test: many agents in one async Ray actor.

Each simulated rank speaks the real protocol (``register``, ``poll``, ``report``)
as one asyncio task with one long-poll outstanding and steps on a fixed clock.
On ``arm`` it does what ``Capture`` does with its window: reports ARMED; FAILED
(``missed_start``) if its step already passed the window's first boundary; else
CAPTURING at ``start_step``, UPLOADING and DONE (no artifacts) at ``stop_step``.
With ``ranks_per_node`` > 0, each run of that many consecutive ranks is a node
whose relay is the real ``actors.relay.RelayCore`` in this process.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import ray

__all__ = ["SimHost", "sum_counters"]


@ray.remote(num_cpus=0)
class SimHost:
    """Many simulated agents in one async actor process."""

    def __init__(
        self, target: str, ranks: list[int], world_size: int, host: int, step_time_s: float,
        ranks_per_node: int = 0, poll_timeout_s: float = 10.0, job_started: float | None = None,
    ) -> None:
        from actors.controller.handle import find_controller
        from actors.relay import RelayCore
        from orchestrator.build import build_id
        from orchestrator.models.agent_protocol import WorkerInfo

        self.infos = [
            WorkerInfo(
                agent_id=f"sim-{target}-{r}", target=target, world_rank=r, world_size=world_size, local_rank=r % 8,
                node_rank=host, node_id=f"simnode{host}", host=f"sim{host}", pid=100_000 + r, device="cpu",
                torch_version="sim",
                build=build_id(),
            )
            for r in ranks
        ]
        self.step_time_s = step_time_s
        # Step 0's time (``time.monotonic``, one clock for every process of the machine): hosts of one
        # job share it, so their ranks move in lockstep as a data-parallel job's do. Else: at step 50
        # now, like a job already training.
        self.t0 = job_started if job_started is not None else time.monotonic() - 50 * step_time_s
        self.calls = {"register": 0, "poll": 0, "report": 0}
        # Each rank's registration secret, as the controller issued it: its later calls carry it.
        self.secrets: dict[str, str | None] = {}
        self.outstanding_polls = 0
        self.arms = 0
        self.missed = 0
        self.tasks: list[asyncio.Task] = []
        self.stopped = False
        self.controller: Any = None
        # With ranks_per_node, consecutive ranks share a simulated node whose relay is the real
        # RelayCore, run in this process: the controller sees the relays' calls, as on a cluster.
        self.relays: dict[str, Any] = {}
        if ranks_per_node:
            for info in self.infos:
                node = f"sim-{target}-node{info.world_rank // ranks_per_node}"
                if node not in self.relays:
                    self.relays[node] = RelayCore(node, find_controller, poll_timeout_s)
                self.relays[info.agent_id] = self.relays[node]

    def step(self) -> int:
        return int((time.monotonic() - self.t0) / self.step_time_s)

    def _at_step(self, step: int) -> float:
        return self.t0 + step * self.step_time_s

    async def start(self, spread_s: float) -> float:
        """Register every rank (concurrently, as real workers start together); returns seconds.

        Each rank's first poll starts at a random point within ``spread_s``:
        real workers attach at different moments, so their long-polls are out
        of phase; started together they would all time out in the same instant.
        """
        from actors.controller.handle import find_controller

        self.controller = find_controller()
        t0 = time.monotonic()
        await asyncio.gather(*(self._register(info) for info in self.infos))
        elapsed = time.monotonic() - t0
        rng = random.Random(self.infos[0].world_rank)
        self.tasks = [
            asyncio.get_running_loop().create_task(self._agent(info, rng.uniform(0, spread_s))) for info in self.infos
        ]
        return elapsed

    async def _register(self, info: Any) -> None:
        secret = self.secrets.get(info.agent_id)
        self.secrets[info.agent_id] = await self._call(info, "register", lambda up: up.register(info, secret=secret))

    async def _call(self, info: Any, name: str, call: Any) -> Any:
        """``call(upstream)`` through the agent's relay (in process) or at the controller, counted as ``name``."""
        from actors.upstream import AgentUpstreamRpc

        relay = self.relays.get(info.agent_id)
        result = await call(relay if relay is not None else AgentUpstreamRpc(self.controller))
        self.calls[name] += 1
        return result

    async def _agent(self, info: Any, delay_s: float) -> None:
        from orchestrator.models.agent_protocol import ArmCommand, Heartbeat, RegisterCommand

        await asyncio.sleep(delay_s)
        while not self.stopped:
            try:
                self.outstanding_polls += 1
                try:
                    beat = Heartbeat(agent_id=info.agent_id, step=self.step(), step_time_s=self.step_time_s)
                    secret = self.secrets.get(info.agent_id)
                    command = await self._call(info, "poll", lambda up, beat=beat, secret=secret: up.poll(beat, secret))
                finally:
                    self.outstanding_polls -= 1
                match command:
                    case RegisterCommand():
                        await self._register(info)
                    case ArmCommand(window=window):
                        self.arms += 1
                        # Like Capture: the window is armed when the command arrives, so whether its
                        # start has passed is decided now, not after ARMED is acknowledged.
                        asyncio.get_running_loop().create_task(self._window(info, window, self.step(), datetime.now(timezone.utc)))
            except asyncio.CancelledError:
                return
            except Exception:
                # Like the real agent: keep going, never die of a failed call.
                await asyncio.sleep(0.5)

    async def _window(self, info: Any, window: Any, now_step: int, armed_at: datetime) -> None:
        from orchestrator.models.profile import RankEvent
        from orchestrator.models.requests import RankState

        def event(state: RankState, **kw: Any) -> RankEvent:
            return RankEvent(profile_id=window.profile_id, agent_id=info.agent_id, state=state, **kw)

        async def report(event: RankEvent) -> None:
            secret = self.secrets.get(info.agent_id)
            await self._call(info, "report", lambda up: up.report(event, secret))

        await report(event(RankState.ARMED, at=armed_at))
        first = window.start_step - window.warmup
        if now_step >= first:
            self.missed += 1
            await report(event(
                RankState.FAILED, reason=f"window start boundary {first} had passed (rank was at step {now_step})",
                missed_start=True))
            return
        opened = self._at_step(window.start_step)
        await asyncio.sleep(max(0.0, opened - time.monotonic()))
        # A real rank stamps CAPTURING on its training thread at the boundary that opened the
        # window; with 256 ranks a simulator's loop wakes late, which is not the window's lateness.
        at = datetime.now(timezone.utc) - timedelta(seconds=max(0.0, time.monotonic() - opened))
        await report(event(RankState.CAPTURING, at=at))
        await asyncio.sleep(max(0.0, self._at_step(window.stop_step) - time.monotonic()))
        await report(event(RankState.UPLOADING))
        await report(event(
            RankState.DONE, first_step=window.start_step, last_step=window.stop_step - 1,
            step_durations_ms=[self.step_time_s * 1e3] * window.steps, artifacts=[]))

    def counters(self) -> dict[str, Any]:
        """Calls that reached the controller (the relays' when there are relays), and rank-level counts."""
        total = sum(self.calls.values())
        if self.relays:
            cores = {id(core): core for core in self.relays.values()}.values()
            total = sum(sum(core.upstream_calls.values()) for core in cores)
        return {"calls": dict(self.calls), "outstanding_polls": self.outstanding_polls, "arms": self.arms,
                "missed": self.missed, "total": total}

    async def hammer(self, seconds: float, concurrency: int) -> int:
        """Cheap protocol calls (a report for an unknown profile) as fast as the controller answers."""
        from actors.upstream import AgentUpstreamRpc
        from orchestrator.models.profile import RankEvent
        from orchestrator.models.requests import RankState

        event = RankEvent(profile_id="no-such-profile", agent_id=self.infos[0].agent_id, state=RankState.ARMED)
        secret = self.secrets.get(event.agent_id)
        upstream = AgentUpstreamRpc(self.controller)
        deadline = time.monotonic() + seconds
        done = 0

        async def lane() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await upstream.report(event, secret)
                done += 1

        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return done

    async def stop(self) -> None:
        self.stopped = True
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def sum_counters(hosts: list[Any]) -> dict[str, Any]:
    got = ray.get([h.counters.remote() for h in hosts], timeout=60)
    return {
        "total": sum(c["total"] for c in got),
        "outstanding_polls": sum(c["outstanding_polls"] for c in got),
        "poll": sum(c["calls"]["poll"] for c in got),
        "report": sum(c["calls"]["report"] for c in got),
        "arms": sum(c["arms"] for c in got),
        "missed": sum(c["missed"] for c in got),
    }
