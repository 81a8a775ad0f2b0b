"""The run of one profile, from PENDING to a terminal state, on the controller's event loop.

Facts come from the registry (who is alive, where each rank is); decisions
come from :mod:`actors.controller.profiles.planning`; every state change goes through
:meth:`Runner.transition`, which saves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from actors.controller.agents.registry import Registry, Worker
from actors.controller.clock import SYSTEM_CLOCK, Clock
from actors.controller.profiles.commit import Commit
from actors.controller.profiles.planning import (
    arm_round_s,
    outcome,
    plan_window,
    rearm_after_missed_start,
    selected_ranks,
    start_step,
    timeout_s,
    trace_bytes_per_step,
)
from actors.controller.profiles.state import Profile, Record, wait_event
from orchestrator.models.agent_protocol import ArmCommand, CancelCommand, SyncCommand, WindowSpec
from orchestrator.models.control import ControllerConfig
from orchestrator.models.profile import Manifest, RankResult
from orchestrator.models.requests import ProfileState, RankState

__all__ = ["PostprocessFn", "Runner"]

logger = logging.getLogger(__name__)

_RESCAN_S = 0.02

# (draft manifest, profile, timeout) -> manifest with the merged trace, report and summary added.
PostprocessFn = Callable[[Manifest, Profile, float], Awaitable[Manifest]]


class Runner:
    """Carries profiles through their states; shared by every profile of one controller."""

    def __init__(
        self,
        registry: Registry,
        commit: Commit,
        config: Callable[[], ControllerConfig],
        profiles: Callable[[], list[Profile]],
        postprocess: PostprocessFn,
        cluster_info: Callable[[Profile], dict[str, Any]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._registry = registry
        self._commit = commit
        self._config = config
        self._profiles = profiles
        self._postprocess = postprocess
        self._cluster_info = cluster_info
        # The registry's clock: timeouts, the wait for ranks to register and the sync round are counted
        # on it (a rank's heartbeat times are), so a test that steps it steps them.
        self._clock = clock
        # Target -> how long its last window took to arm every rank.
        self._arm_rounds: dict[str, float] = {}
        # Profile id -> times armed again in its current run; present once its first step ran.
        self._rearms: dict[str, int] = {}

    async def run(self, profile: Record) -> None:
        """Step the profile until it is terminal, waiting for news from its ranks between steps. A stacks
        bundle restored unfinished ends at once: the controller that asked for its stacks is gone."""
        if not isinstance(profile, Profile):
            await self._commit.end(profile, ProfileState.FAILED, "the controller restarted while the stacks were taken", None)
            return
        try:
            while not await self.step(profile):
                await self._wait_for_news(profile)
        except Exception as e:
            logger.exception("rayprof controller: profile %s failed", profile.id)
            if not profile.state.is_terminal:
                await self.fail_without_storage(profile, f"controller error: {type(e).__name__}: {str(e)[:300]}")
        finally:
            self._rearms.pop(profile.id, None)

    async def step(self, profile: Profile) -> bool:
        """One iteration of the loop :meth:`run` repeats; True once the profile is terminal.

        The first step of a run schedules the profile (unless restored past that); every
        step checks each rank once (lost, timed out, the profile's state to advance), and
        once every rank has ended arms again (every rank missed the start) or finishes. A
        step never waits for news from a rank, so a test can drive a profile one iteration
        at a time, as Ray Train v2's controller tests step its loop.
        """
        if profile.state.is_terminal:
            return True
        if profile.id not in self._rearms:
            self._rearms[profile.id] = 0
            if profile.cancel_requested and profile.window is None:
                await self.finish(profile, ProfileState.CANCELLED, "cancelled before it was scheduled")
                return True
            if profile.window is None:
                await self._schedule(profile)
                if profile.state.is_terminal:
                    return True
        if not await self._check_ranks(profile):
            return False
        rearms = self._rearms[profile.id]
        if rearm_after_missed_start(profile.ranks.values(), rearms, profile.cancel_requested):
            self._rearms[profile.id] = rearms + 1
            self._remember_arm_round(profile)
            logger.info("rayprof controller: %s: every rank missed the start of %s; arming again", profile.id, profile.window)
            # Every rank said it was past the missed start: the new one comes after it, whatever a
            # stale step count (a sync that timed out, a heartbeat in flight) says.
            past = profile.window.start_step if profile.window else 0
            # No rank holds the window now: a cancel before the new arms go out ends the ranks at once.
            profile.window = None
            await self._schedule(profile, past=past)
            # The new window's ranks are checked at once, not after a wait for news.
            return await self.step(profile)
        state, reason = outcome(list(profile.ranks.values()), profile.window, profile.cancel_requested)
        await self.finish(profile, state, reason)
        return True

    async def transition(self, profile: Profile, state: ProfileState) -> None:
        """Change state, then save it; a save that fails is logged, and the next change saves again."""
        await self._commit.transition(profile, state)

    async def fail_without_storage(self, profile: Profile, reason: str) -> None:
        """The last resort: record FAILED with the reason, without a manifest; a failed save is only logged."""
        profile.finished_at = profile.finished_at or self._clock.wall()
        if not profile.state.is_terminal:
            await self._commit.end(profile, ProfileState.FAILED, reason, manifest=None)

    async def _schedule(self, profile: Profile, past: int = 0) -> None:
        """Pick the start step ahead of the fastest rank (and of ``past``, a step every rank is known to
        have reached) and arm every selected rank."""
        config = self._config()
        workers = self._registry.run_workers(profile.target, profile.run)
        if not workers:
            await self.finish(profile, ProfileState.FAILED, f"target {profile.target!r} has no live workers")
            return
        profile.run = profile.run or next(iter(workers.values())).run
        selected = selected_ranks(profile.request, max(w.info.world_size for w in workers.values()))
        # Right after a controller or worker-group restart some agents have not
        # re-registered yet; they do within a poll timeout, so give them that long.
        wait_until = self._clock.monotonic() + config.poll_timeout_s
        while any(r not in workers for r in selected) and self._clock.monotonic() < wait_until:
            await asyncio.sleep(0.05)
            workers = self._registry.run_workers(profile.target, profile.run)
        for rank in selected:
            worker = workers.get(rank)
            if worker is None:
                profile.ranks[rank] = RankResult(
                    rank=rank,
                    state=RankState.FAILED,
                    reason=f"no agent registered for this rank within {config.poll_timeout_s:g}s",
                )
            else:
                profile.ranks[rank] = RankResult.waiting(worker.info, worker.step_definition)
                profile.agents[rank] = worker.info.agent_id
        present = [workers[r] for r in selected if r in workers]
        if not present:
            return
        sync_round_s = await self._sync(present, config.sync_timeout_s)
        if profile.cancel_requested:
            return
        now = self._clock.monotonic()
        start = start_step(
            max(past, *(w.estimated_step(now) for w in present)),
            (pace for w in present if (pace := w.pace_s())),
            sync_round_s,
            config.arm_lead_s,
            profile.request.warmup,
            relayed=all(w.relay is not None for w in present),
            last_arm_round_s=self._arm_rounds.get(profile.target),
        )
        per_step = trace_bytes_per_step(profile.request, self._profiles())
        profile.window = plan_window(profile.request, start, per_step, config.max_trace_bytes)
        profile.scheduled_at = self._clock.wall()
        profile.deadline = self._clock.monotonic() + timeout_s(profile.request, config)
        window = WindowSpec(
            profile_id=profile.id,
            target=profile.target,
            start_step=profile.window.start_step,
            steps=profile.window.steps,
            warmup=profile.request.warmup,
            options=profile.request.torch_options(),
            storage=profile.storage,
            prefix=profile.prefix,
            max_trace_bytes=config.max_trace_bytes,
        )
        for worker in present:
            worker.send(ArmCommand(window=window))
        if profile.state == ProfileState.SCHEDULED:  # armed again: save the new window
            await self._commit.save(profile)
        else:
            await self.transition(profile, ProfileState.SCHEDULED)

    async def _sync(self, present: list[Worker], timeout: float) -> float:
        """Ask for fresh step counts so the start step is chosen from where ranks are now; returns the round's length."""
        sent = self._clock.monotonic()
        for worker in present:
            worker.send(SyncCommand())
        stale = present
        # Only the ranks not heard from yet are checked again: at 1,024 ranks a full scan
        # every few milliseconds costs the event loop more than the answers do.
        while (stale := [w for w in stale if w.seen_at < sent]) and self._clock.monotonic() < sent + timeout:
            await asyncio.sleep(0.01)
        return self._clock.monotonic() - sent

    async def _check_ranks(self, profile: Profile) -> bool:
        """Check every rank once, failing the ones that timed out or vanished; True when every rank has ended."""
        limit = timeout_s(profile.request, self._config())
        if profile.deadline is None:
            profile.deadline = self._clock.monotonic() + limit
        self._end_lost_ranks(profile)
        ranks = profile.ranks.values()
        if all(r.state.is_terminal for r in ranks):
            return True
        if profile.state == ProfileState.SCHEDULED and profile.capture_started_at is not None:
            await self.transition(profile, ProfileState.CAPTURING)
        capture_over = all(r.state == RankState.UPLOADING or r.state.is_terminal for r in ranks)
        if profile.state in (ProfileState.SCHEDULED, ProfileState.CAPTURING) and capture_over:
            await self.transition(profile, ProfileState.COLLECTING)
        if profile.deadline - self._clock.monotonic() > 0:
            return False
        # The saves above let the reaper run: a worker it dropped meanwhile fails its rank as lost
        # (with why, and told to drop the window if it comes back), not as timed out.
        self._end_lost_ranks(profile)
        for rank, result in profile.ranks.items():
            if not result.state.is_terminal:
                reason = f"no result within the {limit:g}s timeout (last state {result.state.value})"
                profile.ranks[rank] = _ended(result, RankState.FAILED, reason, self._clock.wall())
                # A rank still holding the window (a lagging rank far from its start) would
                # refuse every later window until it reached it: it is told to drop it now.
                worker = self._registry.workers.get(profile.agents.get(rank, ""))
                if worker is not None:
                    worker.send(CancelCommand(profile_id=profile.id))
        return True

    async def _wait_for_news(self, profile: Profile) -> None:
        left = (profile.deadline or 0.0) - self._clock.monotonic()
        profile.changed.clear()
        await wait_event(profile.changed, max(0.0, min(left, 1.0)))
        # Events come in bursts (a relay's batch, a thousand ranks arming); one scan of
        # every rank per burst, not per event, keeps this O(ranks) per window.
        await asyncio.sleep(_RESCAN_S)

    def _end_lost_ranks(self, profile: Profile) -> None:
        workers = self._registry.workers
        for rank, result in profile.ranks.items():
            if result.state.is_terminal:
                continue
            agent_id = profile.agents.get(rank)
            if profile.cancel_requested and (agent_id is None or agent_id not in workers):
                profile.ranks[rank] = _ended(result, RankState.CANCELLED, "cancelled", self._clock.wall())
            elif agent_id is not None and agent_id not in workers:
                why = self._registry.why_gone(agent_id) or "its process exited or was restarted"
                reason = f"worker stopped responding during the window: {why}"
                profile.ranks[rank] = _ended(result, RankState.FAILED, reason, self._clock.wall())
                # It may only have gone silent (a long pause): if it registers again, it is told to drop
                # the window it still holds, which would make it refuse every later one.
                self._registry.send(agent_id, CancelCommand(profile_id=profile.id))

    def forget(self, targets: list[str]) -> None:
        """Drop what is kept about targets gone for good."""
        for target in targets:
            self._arm_rounds.pop(target, None)

    def _remember_arm_round(self, profile: Profile) -> None:
        arm_round = arm_round_s(profile.ranks.values(), profile.scheduled_at)
        if arm_round is not None:
            self._arm_rounds[profile.target] = arm_round

    async def finish(self, profile: Profile, state: ProfileState, reason: str | None) -> None:
        """Make the manifest (with the postprocess's artifacts), then end the profile at the commit point."""
        profile.finished_at = self._clock.wall()
        self._remember_arm_round(profile)
        manifest = profile.manifest_of(state, reason, cluster=self._cluster_info(profile))
        if any(a.kind == "trace" for a in manifest.all_artifacts()) and state != ProfileState.CANCELLED:
            manifest = await self._postprocess(manifest, profile, self._config().postprocess_timeout_s)
        await self._commit.end(profile, state, reason, manifest)


def _ended(result: RankResult, state: RankState, reason: str, at: datetime) -> RankResult:
    return result.model_copy(update={"state": state, "reason": reason, "finished_at": at})
