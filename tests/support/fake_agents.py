"""Fake agents that drive the real ``Controller`` class on one asyncio loop, without Ray.

Each fake speaks the agent protocol (register, long-poll with heartbeats,
report) and trains by counting steps on a timer, or on the test's clock when
``stepped`` (``tests.support.stepped_runner.SteppedMonitor``). ``behaviour`` plants a
fault: ``fail`` reports its window FAILED, ``hang`` never reports after
capturing, ``stall_upload`` stays UPLOADING, ``vanish`` stops calling once armed,
``late_arm`` gets its first arm after the window's start had passed, ``always_late`` every arm. A finished window uploads a
small real file to the profile's storage and lists it, as the capture
pipeline does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import torch

from actors.controller.actor import Controller
from actors.controller.agents.agent_side import ActorDeaths
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.saved.persistence import Persistence
from orchestrator.build import build_id
from orchestrator.layout import rank_artifact_keys
from orchestrator.models.agent_protocol import (
    ArmCommand,
    CancelCommand,
    Command,
    Heartbeat,
    MemoryHistoryCommand,
    OomReport,
    RegisterCommand,
    SnapshotDestination,
    StacksCommand,
    StorageSpec,
    WindowSpec,
    WorkerInfo,
)
from orchestrator.models.common import utcnow
from orchestrator.models.control import ControllerConfig
from orchestrator.models.diagnosis import Collective, Frame, RankStacks, ThreadStack, WatchStatus
from orchestrator.models.profile import ArtifactKind, ProfileStatus, RankEvent
from orchestrator.models.requests import RankState
from orchestrator.storage import open_storage
from tests.support.local_recorder import LocalRecorders

Behaviour = Literal["ok", "fail", "hang", "vanish", "stall_upload", "late_arm", "always_late"]
STEP_S = 0.01
UPLOAD_S = 0.1

TRAIN_FRAME = Frame(filename="/job/train.py", line=30, function="train_loop", code="loss.backward()")
ALL_REDUCE = [
    TRAIN_FRAME.model_copy(update={"line": 41, "code": "dist.all_reduce(loss)"}),
    Frame(filename="/venv/site-packages/torch/distributed/distributed_c10d.py", line=3245, function="all_reduce", library=True),
]
SLOW_THING = [TRAIN_FRAME, Frame(filename="/job/train.py", line=57, function="slow_thing", code="time.sleep(3600)")]
# In a transformers Trainer's evaluate, as a rank evaluating past the stall threshold is.
EVALUATING = [
    Frame(filename="/job/train.py", line=12, function="train_func"),
    Frame(filename="/venv/site-packages/transformers/trainer.py", line=2871, function="evaluate", library=True),
    Frame(filename="/venv/site-packages/torch/nn/modules/linear.py", line=134, function="forward", library=True),
]


def fast_config(home: StorageSpec, **overrides: object) -> ControllerConfig:
    """Settings that make a window take well under a second."""
    values: dict[str, object] = dict(
        storage=home,
        max_steps=50,
        max_warmup_steps=10,
        poll_timeout_s=0.2,
        worker_expiry_grace_s=0.3,
        arm_lead_s=0.02,
        sync_timeout_s=0.5,
        request_timeout_s=5.0,
        max_request_timeout_s=60.0,
        max_trace_bytes=10**9,
        max_queued_per_target=2,
        postprocess_timeout_s=5.0,
        retention_count=1000,
        retention_days=30.0,
        cluster_name="unit",
    )
    values.update(overrides)
    return ControllerConfig(**values)


# The stall detector and watches on a fast clock, for tests of them.
MONITORED = {"stall_min_s": 0.5, "monitor_interval_s": 0.05}


def run(coro, timeout_s: float = 30.0):
    """Run one test's coroutine, bounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


# The Ray cluster every controller made here stands in for: a new one on the same home is a restart.
FAKE_RAY_CLUSTER = "fake-ray-cluster"


def make_controller(
    home: StorageSpec,
    clock: Clock = SYSTEM_CLOCK,
    recorder: LocalRecorders | None = None,
    actor_deaths: ActorDeaths | None = None,
    **overrides: object,
) -> Controller:
    """The real controller on ``home`` with fast settings and no postprocess, on ``clock``; its gauges go to
    local recorders (``recorder``, to read them); ``actor_deaths`` stands in for Ray's GCS (default: every actor
    alive)."""
    return Controller(
        fast_config(home, **overrides),
        postprocess=no_postprocess,
        cluster=FAKE_RAY_CLUSTER,
        clock=clock,
        recorder=recorder or LocalRecorders(),
        actor_deaths=actor_deaths or (lambda actor_ids: {}),
    )


async def no_postprocess(draft, profile, timeout_s):
    return draft


def worker_info(rank: int, world_size: int, target: str = "run", job: str = "job1", agent: str | None = None) -> WorkerInfo:
    return WorkerInfo(
        agent_id=agent or f"{target}-{job}-r{rank}",
        target=target,
        world_rank=rank,
        world_size=world_size,
        local_rank=rank,
        node_rank=0,
        node_id=f"node{rank % 2}",
        host=f"host{rank % 2}",
        pid=1000 + rank,
        device="cpu",
        ray_job_id=job,
        torch_version=torch.__version__,
        build=build_id(),  # an agent of this build, as the controller's own
        actor_id=f"actor-of-{agent or f'{target}-{job}-r{rank}'}",
    )


@dataclass
class FakeAgent:
    controller: Controller
    info: WorkerInfo
    behaviour: Behaviour = "ok"
    trace_bytes: int = 1000
    # What finish() uploads: an op table (no postprocess), or "trace" so the controller runs its postprocess.
    upload: ArtifactKind = "op_table"
    step: int = 0
    windows: list[WindowSpec] = field(default_factory=list)
    # This rank's step when each window's arm reached it.
    armed_at_steps: list[int] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    window_task: asyncio.Task | None = None
    stopped: bool = False
    # What a ``stacks`` command sees in the training thread; None: this agent never answers one.
    stack: list[Frame] | None = field(default_factory=lambda: list(ALL_REDUCE))
    collectives: list[Collective] = field(default_factory=list)
    # Steps advance while True; a stuck rank stops counting but its agent still heartbeats.
    training: bool = True
    step_s: float = STEP_S
    # Whether heartbeats carry a step time (an agent measures none in its first second).
    reports_step_time: bool = True
    # How far this rank's clock is from the controller's (events carry the rank's time, as the agent's do).
    clock_offset_s: float = 0.0
    # When set, an arm is acknowledged (ARMED) only once this is set: a test can act between the two.
    arm_ack_gate: asyncio.Event | None = None
    # What the controller issued at registration; every later call carries it, as the agent's do.
    secret: str | None = None
    # Whether an OOM watch has this rank record the CUDA allocator's history (memory_history commands).
    recording: bool = False
    # Extra artifacts a stacks answer with memory lists (a test plants a key outside the rank's place).
    extra_snapshot_files: list = field(default_factory=list)
    # Steps move only when the test steps the clock (:meth:`advance`), not on a timer.
    stepped: bool = False
    _carry_s: float = 0.0
    # The long-poll loop (a test cancels it to pause the agent).
    poll_task: asyncio.Task | None = None
    # What one step is, said in every heartbeat (None: nothing, as an agent that has seen no step).
    step_definition: str | None = None

    async def register(self) -> str | None:
        self.secret = await self.controller.register(self.info, secret=self.secret)
        return self.secret

    async def start(self) -> None:
        assert await self.register()
        self.poll_task = asyncio.create_task(self._poll())
        self._tasks = [self.poll_task]
        if not self.stepped:
            self._tasks.append(asyncio.create_task(self._train()))

    async def stop(self) -> None:
        self.stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _train(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            if self.training:
                self.step += 1

    def advance(self, seconds: float) -> None:
        """Train for ``seconds`` of the test's clock: the steps that fit in them (a part step carries over)."""
        if not self.training:
            return
        self._carry_s += seconds
        steps = int(self._carry_s / self.step_s + 1e-9)  # 0.05 s at 0.01 s a step is 5 steps, not 4.999...
        self.step += steps
        self._carry_s = max(0.0, self._carry_s - steps * self.step_s)

    async def _poll(self) -> None:
        while not self.stopped:
            command: Command | None = await self.controller.poll(
                Heartbeat(agent_id=self.info.agent_id, step=self.step, step_time_s=self.step_s if self.reports_step_time else None,
                          step_definition=self.step_definition),
                self.secret,
            )
            match command:
                case StacksCommand(profile_id=bundle_id, memory=memory):
                    if self.stack is not None:
                        reply = self.stacks(bundle_id)
                        if memory is not None:
                            reply = reply.model_copy(update=self.snapshot(memory))
                        await self.controller.stacks_reply(reply, self.secret)
                case MemoryHistoryCommand(record=record):
                    self.recording = record
                case RegisterCommand():
                    await self.register()
                case ArmCommand(window=window):
                    self.windows.append(window)
                    self.armed_at_steps.append(self.step)
                    self.window_task = asyncio.create_task(self._window(window))
                    self._tasks.append(self.window_task)
                case CancelCommand(profile_id=profile_id):
                    self.cancelled.add(profile_id)

    def stacks(self, bundle_id: str | None) -> RankStacks:
        assert bundle_id is not None and self.stack is not None
        threads = [
            ThreadStack(thread_id=1, name="MainThread", frames=[Frame(filename="/ray/worker.py", line=1, function="main_loop", library=True)]),
            ThreadStack(thread_id=2, name="train", training=True, frames=self.stack),
        ]
        return RankStacks(
            bundle_id=bundle_id, agent_id=self.info.agent_id, step=self.step, taken_at=utcnow(), threads=threads,
            collectives=self.collectives,
            flight_recorder='{"entries": []}' if self.collectives else None,
            flight_recorder_note=None if self.collectives else "torch flight recorder is off",
        )

    def snapshot(self, dest: SnapshotDestination) -> dict[str, object]:
        """What the agent's MemoryWatch answers: its snapshot and page stored, or why not."""
        if not self.recording:
            return {"memory_note": "this rank records no allocator history"}
        storage = open_storage(dest.storage).scoped(dest.prefix)
        keys = rank_artifact_keys(self.info.world_rank, self.info.host, self.info.pid)
        files = [
            storage.put_bytes(b"snapshot", keys["memory_snapshot"], "memory_snapshot"),
            storage.put_bytes(b"<html></html>", keys["memory_view"], "memory_view"),
        ]
        return {"artifacts": files + self.extra_snapshot_files}

    async def oom(self, asked_bytes: int, free_bytes: int) -> None:
        """What the agent's observer reports when an allocation fails while it records."""
        await self.controller.oom(
            OomReport(agent_id=self.info.agent_id, device=0, asked_bytes=asked_bytes, limit_bytes=80 * 2**30,
                      free_bytes=free_bytes, at=utcnow()),
            self.secret,
        )

    async def report(self, window: WindowSpec, state: RankState, **fields: object) -> None:
        at = utcnow() + timedelta(seconds=self.clock_offset_s)
        await self.controller.report(
            RankEvent(profile_id=window.profile_id, agent_id=self.info.agent_id, state=state, at=at, **fields),
            self.secret,
        )

    async def _window(self, window: WindowSpec) -> None:
        if self.arm_ack_gate is not None:
            await self.arm_ack_gate.wait()
        await self.report(window, RankState.ARMED)
        if self.behaviour == "always_late" or (self.behaviour == "late_arm" and len(self.windows) == 1):
            reason = f"window start boundary {window.start_step} had passed (rank was at step {window.start_step + 1})"
            await self.report(window, RankState.FAILED, reason=reason, missed_start=True)
            return
        if self.behaviour == "vanish":
            self.stopped = True
            return
        while self.step < window.start_step and window.profile_id not in self.cancelled:
            await asyncio.sleep(STEP_S / 2)
        if window.profile_id in self.cancelled:
            await self.report(window, RankState.CANCELLED, reason="cancelled")
            return
        await self.report(window, RankState.CAPTURING)
        while self.step < window.stop_step and window.profile_id not in self.cancelled:
            await asyncio.sleep(STEP_S / 2)
        if window.profile_id in self.cancelled:
            await self.report(window, RankState.CANCELLED, reason="cancelled while capturing")
            return
        if self.behaviour == "hang":
            return
        await self.report(window, RankState.UPLOADING)
        await asyncio.sleep(UPLOAD_S)
        if self.behaviour == "fail":
            await self.report(window, RankState.FAILED, reason="export failed: planted")
        elif self.behaviour != "stall_upload":
            await self.finish(window)

    async def finish(self, window: WindowSpec) -> None:
        """Upload this rank's file and report the window DONE."""
        key = rank_artifact_keys(self.info.world_rank, self.info.host, self.info.pid)[self.upload]
        body = b"{}" if self.upload == "trace" else b"name,count\n"
        artifact = open_storage(window.storage).scoped(window.prefix).put_bytes(body, key, self.upload)
        await self.report(
            window,
            RankState.DONE,
            first_step=window.start_step,
            last_step=window.stop_step - 1,
            step_durations_ms=[STEP_S * 1000] * window.steps,
            trace_bytes=self.trace_bytes,
            artifacts=[artifact],
        )


async def start_agents(controller: Controller, world_size: int, **kwargs: object) -> list[FakeAgent]:
    agents = [FakeAgent(controller, worker_info(r, world_size)) for r in range(world_size)]
    for agent in agents:
        for key, value in kwargs.items():
            setattr(agent, key, value)
        await agent.start()
    return agents


async def wait_terminal(controller: Controller, profile_id: str, timeout_s: float = 10.0):
    """Poll with ``wait`` until terminal; returns the status and every state seen."""
    seen = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        status = await controller.wait(profile_id, 0.5)
        if not seen or seen[-1] != status.state:
            seen.append(status.state)
        if status.state.is_terminal:
            return status, seen
    raise AssertionError(f"{profile_id} did not end within {timeout_s}s; states seen {seen}")


async def until(holds: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.01) -> bool:
    """Check ``holds`` every ``interval_s`` until it is true or ``timeout_s`` passes; returns the last answer
    (the test's own assertions say what a timeout means)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (held := holds()) and loop.time() < deadline:
        await asyncio.sleep(interval_s)
    return held


async def saved_watch(home: StorageSpec, watch_id: str) -> WatchStatus | None:
    """The watch as storage holds it, which is what a restarted controller reads: a firing shows in
    the running controller's memory before its save lands."""
    saved = await Persistence(home, fast_config(home).cluster_name).load_watches()
    return next((w for w in saved if w.id == watch_id), None)


async def until_saved(
    home: StorageSpec, watch_id: str, holds: Callable[[WatchStatus], bool], *, timeout_s: float
) -> bool:
    """Read the watch from storage until ``holds(watch)`` or ``timeout_s`` passes; whether it held. A test
    waits on this before a restart, which reads storage."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        saved = await saved_watch(home, watch_id)
        if saved is not None and holds(saved):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)


async def status_when(
    controller: Controller, profile_id: str, holds: Callable[[ProfileStatus], bool], *, timeout_s: float,
    interval_s: float = 0.01,
) -> ProfileStatus:
    """Poll a profile's status until ``holds(status)`` or ``timeout_s`` passes; returns the last status seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not holds(status := await controller.get(profile_id)) and loop.time() < deadline:
        await asyncio.sleep(interval_s)
    return status
