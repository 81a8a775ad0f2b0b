"""The agent that lives inside every Ray Train worker process.

Public surface: :func:`attach` (call it in the train function) and :func:`step`
(an explicit step boundary); the setup hook (:func:`actors.agent.install`) calls
:func:`adopt_lazy_hook` at a worker's first optimizer step, or
:func:`adopt_backward_passes` where its loop runs backward passes and steps no optimizer.

Hot path: a step boundary increments a counter and checks one attribute. Only
when a window is armed does it do more. All talking to the controller happens
on a daemon thread with exactly one long-poll outstanding, to the controller
or, in a job of ``RAYPROF_RELAY_MIN_WORLD_SIZE`` ranks or more, to the relay on
this node, which speaks the same calls for all the node's ranks.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal

from actors.agent import hook as setup_hook
from actors.agent.capture import Capture
from actors.agent.cuda_memory import TorchAllocator
from actors.agent.memory_watch import MemoryWatch
from actors.agent.pace import Pace
from actors.agent.step_cycle import BACKWARD_STEP, EXPLICIT_STEP, StepCycle
from actors.agent.thread_stacks import take_stacks
from actors.agent.worker_info import worker_info
from actors.upstream import AgentUpstreamRpc
from orchestrator.loops import loop_of_stack
from orchestrator.models.agent_protocol import (
    ArmCommand,
    CancelCommand,
    Command,
    Heartbeat,
    MemoryHistoryCommand,
    OomReport,
    RegisterCommand,
    StacksCommand,
    SyncCommand,
    WindowSpec,
    WorkerInfo,
)
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import RankStacks
from orchestrator.models.profile import RankEvent
from orchestrator.models.requests import RankState
from orchestrator.scratch import sweep_orphans
from orchestrator.settings import (
    DEFAULT_DISCOVERY_INTERVAL_S,
    DEFAULT_POLL_TIMEOUT_S,
    DEFAULT_RELAY_MIN_WORLD_SIZE,
    DISCOVERY_INTERVAL_S_ENV_VAR,
    POLL_TIMEOUT_S_ENV_VAR,
    RELAY_MIN_WORLD_SIZE_ENV_VAR,
    env_float,
    env_int,
)

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["Agent", "adopt_backward_passes", "adopt_lazy_hook", "attach", "step"]

logger = logging.getLogger(__name__)

_MIN_REGISTER_INTERVAL_S = 1.0

_agent: Agent | None = None
_attach_lock = threading.Lock()
_hook_handle: StepCycle | None = None


class Agent:
    """One worker's agent: a step counter, an optional armed window, a poll thread."""

    def __init__(self, info: WorkerInfo) -> None:
        self.info = info
        self.step_count = 0
        # The one attribute the step path checks; set by the poll thread, cleared
        # by the training thread when the window closes.
        self.capture: Capture | None = None
        # What one step is, while the optimizer hook counts steps; None: ``counted`` says.
        self.step_cycle: StepCycle | None = None
        # What one step is without a step cycle: explicit agent.step() calls, or backward passes (no optimizer).
        self.counted = EXPLICIT_STEP
        self._poll_timeout_s = env_float(POLL_TIMEOUT_S_ENV_VAR, DEFAULT_POLL_TIMEOUT_S)
        self._discovery_s = env_float(DISCOVERY_INTERVAL_S_ENV_VAR, DEFAULT_DISCOVERY_INTERVAL_S)
        relay_min = env_int(RELAY_MIN_WORLD_SIZE_ENV_VAR, DEFAULT_RELAY_MIN_WORLD_SIZE)
        self.uses_relay = 0 < relay_min <= info.world_size
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # An OOM watch's part on this rank; an out-of-memory report goes up like any event.
        self.memory = MemoryWatch(info, TorchAllocator(), lambda report: self._inbox.put(("event", report)))
        self._thread = threading.Thread(target=self._run, name="rayprof-agent", daemon=True)
        self.pace = Pace()  # the step time each heartbeat carries, and each window's trace the steps before it
        # attach() runs in the training thread (the train function, or its first optimizer step).
        self.training_thread = threading.get_ident()

    def start(self) -> None:
        """Start the poll thread."""
        self._thread.start()

    def step(self) -> None:
        """A step boundary: the optimizer step just finished."""
        self.step_count += 1
        if self.capture is not None:
            self.capture.on_boundary(self.step_count)

    def _emit(self, event: RankEvent) -> None:
        self._inbox.put(("event", event))

    def _window_closed(self) -> None:
        self.capture = None
        self.pace.window_closed(self.step_count, time.monotonic())

    def _heartbeat(self) -> Heartbeat:
        step_time_s = self.pace.sample(self.step_count, time.monotonic())
        cycle = self.step_cycle
        definition = cycle.definition if cycle is not None else self.counted
        return Heartbeat(agent_id=self.info.agent_id, step=self.step_count, step_time_s=step_time_s, step_definition=definition)

    def _handle(self, command: Command) -> None:
        """Carry out a command; ``sync`` needs nothing but the next poll, ``register`` is the poll thread's."""
        match command:
            case StacksCommand():
                self._stacks(command)
            case MemoryHistoryCommand(record=record):
                self.memory.record(record)
            case ArmCommand(window=window):
                self._arm(window)
            case CancelCommand(profile_id=profile_id):
                capture = self.capture
                if capture is not None and capture.window.profile_id == profile_id:
                    capture.cancelled = True
            case SyncCommand() | RegisterCommand():
                pass

    def _stacks(self, command: StacksCommand) -> None:
        stacks = take_stacks(
            command.profile_id,
            self.info.agent_id,
            self.step_count,
            self.training_thread,
            command.native,
            command.max_bytes,
        )
        if command.memory is not None:
            title = f"CUDA memory of rank {self.info.world_rank}, bundle {command.profile_id}"
            artifacts, note = self.memory.snapshot_to(command.memory, title)
            stacks = stacks.model_copy(update={"artifacts": artifacts, "memory_note": note})
        self._inbox.put(("event", stacks))

    def _arm(self, window: WindowSpec) -> None:
        if self.capture is not None and not self.capture.closed:
            self._emit(
                RankEvent(
                    profile_id=window.profile_id,
                    agent_id=self.info.agent_id,
                    state=RankState.FAILED,
                    reason=f"window {self.capture.window.profile_id} still open on this rank",
                )
            )
            return
        cycle = self.step_cycle
        # Explicit agent.step() calls: whose loop it is from the training thread's stack as it is now (it is in the loop).
        loop = cycle.loop if cycle is not None else loop_of_stack(sys._current_frames().get(self.training_thread))
        before = self.pace.before_window(self.step_count, time.monotonic())
        self.capture = Capture(window, self.info, self._emit, self._window_closed, loop=loop, before=before)
        self._emit(
            RankEvent(profile_id=window.profile_id, agent_id=self.info.agent_id, state=RankState.ARMED, at=utcnow())
        )

    def _find_upstream(self) -> AgentUpstreamRpc | None:
        """Whom to call: this node's relay when the job is large enough, else the controller itself."""
        from actors.controller.handle import find_controller

        controller = find_controller()
        if controller is None or not self.uses_relay:
            return None if controller is None else AgentUpstreamRpc(controller)
        try:
            from actors.relay.relay_actor import relay_for

            return AgentUpstreamRpc(relay_for(self.info, self._poll_timeout_s))
        except Exception as e:
            logger.warning("rayprof agent: no relay on this node (%s); calling the controller directly", e)
            return AgentUpstreamRpc(controller)

    def _run(self) -> None:
        import ray

        # What workers of earlier runs on this node left when Ray killed them mid-upload; on this thread, not training's.
        sweep_orphans()
        upstream: AgentUpstreamRpc | None = None
        registered = False
        # Issued by the controller at registration; every later call carries it. Only this thread uses it.
        secret: str | None = None
        poll: Future[Command | None] | None = None
        unsent: list[RankEvent | RankStacks | OomReport] = []
        last_register = -_MIN_REGISTER_INTERVAL_S
        while True:
            try:
                if upstream is None:
                    upstream = self._find_upstream()
                    if upstream is None:
                        self._wait_inbox(self._discovery_s, unsent)
                        continue
                if not registered:
                    # Told to register again right after registering: something keeps
                    # dropping this worker. Never more than one register a second.
                    time.sleep(max(0.0, last_register + _MIN_REGISTER_INTERVAL_S - time.monotonic()))
                    last_register = time.monotonic()
                    secret = ray.get(upstream.register(self.info, secret=secret), timeout=30)
                    if secret is None:
                        logger.warning("rayprof agent: replaced on rank %d by a newer worker; stopping", self.info.world_rank)
                        return
                    registered = True
                    poll = None
                while unsent:
                    ray.get(self._send(upstream, unsent[0], secret), timeout=30)
                    unsent.pop(0)
                if poll is None:
                    poll = upstream.poll(self._heartbeat(), secret).future()
                    poll.add_done_callback(lambda f: self._inbox.put(("poll", f)))
                kind, payload = self._inbox.get(timeout=self._poll_timeout_s + 30)
                if kind == "event":
                    unsent.append(payload)
                elif kind == "poll" and payload is poll:
                    poll = None
                    match payload.result():
                        case None:
                            pass
                        case RegisterCommand():
                            registered = False
                        case command:
                            self._handle(command)
            except queue.Empty:
                poll = None
            except Exception as e:
                # Controller (or relay) gone or restarting: find it again, re-register, resend. With the message: a
                # loop that cannot recover once logged only "TypeError" a hundred times.
                logger.info("rayprof agent: controller call failed (%s: %.300s); reconnecting", type(e).__name__, e)
                upstream, registered, poll = None, False, None
                self._wait_inbox(self._discovery_s, unsent)

    @staticmethod
    def _send(upstream: AgentUpstreamRpc, item: RankEvent | RankStacks | OomReport, secret: str | None) -> ObjectRef[None]:
        """One event up, by the call that takes its kind."""
        match item:
            case RankStacks():
                return upstream.stacks_reply(item, secret)
            case OomReport():
                return upstream.oom(item, secret)
            case RankEvent():
                return upstream.report(item, secret)

    def _wait_inbox(self, timeout: float, unsent: list[RankEvent | RankStacks | OomReport]) -> None:
        """Sleep up to ``timeout`` but keep collecting events meanwhile."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                kind, payload = self._inbox.get(timeout=left)
            except queue.Empty:
                return
            if kind == "event":
                unsent.append(payload)


def step() -> None:
    """Mark a step boundary explicitly (gradient accumulation, no torch optimizer).

    The first call switches this process from the optimizer hook to explicit steps.
    """
    agent = _agent
    if agent is None:
        return
    if _hook_handle is not None or agent.counted is not EXPLICIT_STEP:
        _remove_hook()
        setup_hook.discard()
        agent.step_cycle = None
        agent.counted = EXPLICIT_STEP
    agent.step()


def attach(*, use_optimizer_hook: bool = True) -> Agent | None:
    """Attach the agent to this Ray Train worker; returns ``None`` outside one.

    Idempotent. With ``use_optimizer_hook`` one step is one cycle of the job's
    optimizer steps (one ``optimizer.step()``, or G's and D's in a GAN: see
    :mod:`actors.agent.step_cycle`); otherwise call :func:`step` once per training step.
    """
    return _attach("optimizer" if use_optimizer_hook else "explicit")


def _attach(counting: Literal["optimizer", "explicit", "backward"]) -> Agent | None:
    global _agent
    with _attach_lock:
        if _agent is not None:
            return _agent
        info = worker_info()
        if info is None:
            return None
        agent = Agent(info)
        if counting == "backward":
            # The setup hook's first-step hook stays: an optimizer step later hands counting to the step cycle.
            agent.counted = BACKWARD_STEP
            setup_hook.count_backward_passes(agent.step)
        else:
            setup_hook.discard()
        agent.start()
        _agent = agent
        if counting == "optimizer":
            _set_hook(agent)
        elif counting == "explicit":
            _remove_hook()
        logger.info("rayprof agent attached: target=%s rank=%d (%s)", info.target, info.world_rank, agent.counted)
        return agent


def adopt_lazy_hook(handle: Any, optimizer: Any, args: Any, kwargs: Any) -> None:
    """The setup hook's first-step hook fired (:mod:`actors.agent.hook`): attach here, or
    stay out of a process that is no Ray Train worker. Either way that hook is done."""
    if handle is not None:
        handle.remove()
    if _agent is not None:
        if _agent.counted is BACKWARD_STEP:
            # It counted backward passes, and an optimizer steps at last (gradient accumulation over more micro-batches
            # than the setup hook waited for): from here one step is a cycle of optimizer steps, the count going on.
            _agent.counted = EXPLICIT_STEP
            _set_hook(_agent).feed(optimizer, args, kwargs)
        return  # else attached explicitly already: it counts steps its own way
    try:
        agent = attach()
    except Exception:
        logger.exception("rayprof: attaching the agent failed; this worker runs without one")
        return
    if agent is not None and _hook_handle is not None:
        # This optimizer step is the first the agent's step cycle sees.
        _hook_handle.feed(optimizer, args, kwargs)


def adopt_backward_passes() -> None:
    """The setup hook saw backward passes and no optimizer step (:mod:`actors.agent.hook`): attach here, one step
    per backward pass, or stay out of a process that is no Ray Train worker. Raises where attaching fails (the
    setup hook logs it and lets go)."""
    if _agent is None and _attach("backward") is None:
        setup_hook.discard()


def _set_hook(agent: Agent) -> StepCycle:
    """Count steps through torch's optimizer post-step hook, one per learned cycle of optimizer steps."""
    global _hook_handle
    _remove_hook()
    _hook_handle = agent.step_cycle = StepCycle(agent.step)
    return _hook_handle


def _remove_hook() -> None:
    global _hook_handle
    if _hook_handle is not None:
        _hook_handle.remove()
        _hook_handle = None
