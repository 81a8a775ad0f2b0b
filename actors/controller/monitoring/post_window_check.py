"""The post-window health check: each rank's steps after a window against its steps before it.

Both sides come from the heartbeats in the run's history (its 1 s tier):
consecutive heartbeats at least a second apart give a segment's step time,
its time over its steps. Before: the segments that end before the window's
warmup begins (up to two minutes of them). After: the segments that begin
past the window's last step and after the rank finished its window (its
trace written and uploaded: that cost is the window's, and is over), in
order. A rank whose segments stay over ``threshold`` x its median before for
more than ``steps`` steps (and three heartbeat segments) is *slower* (the
profiler may not have let go); one whose steps come back within it first is
*ok*. A check still short of steps when the history no longer holds the
window's neighbourhood (10 minutes), or when the run ended, ends *unknown*
for the ranks that lack them.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from actors.controller.monitoring.step_history import TIERS, History
from actors.controller.profiles.state import Profile, Record
from orchestrator.models.post_window import PostWindowCheck, RankPostWindow, Verdict

__all__ = ["PostWindowChecks", "awaits_check", "check_rank", "segments", "summarize"]

logger = logging.getLogger(__name__)

# A segment spans at least this long: heartbeats milliseconds apart (a sync round) are noise.
_MIN_SEGMENT_S = 1.0
_BASELINE_SEGMENTS = 30
# A rank is slower only over this many heartbeat segments in a row too: with fast steps one
# segment spans hundreds of steps, and one noisy segment must not decide.
_MIN_SLOW_SEGMENTS = 3
_LOOKBACK_S = 120.0
# Past this the 1 s tier no longer holds the steps before the window.
_GIVE_UP_S = TIERS[0].span_s
# Checks are read every this many monitor ticks: at 1,024 ranks one pass reads ~100k points.
_EVERY_TICKS = 5
_RANK_ORDER: dict[Verdict, int] = {"slower": 3, "pending": 2, "unknown": 1, "ok": 0}


def segments(points: Iterable[tuple[float, int, float]]) -> list[tuple[float, int, int, float]]:
    """(start time, first step, last step, step time) between heartbeats at least ``_MIN_SEGMENT_S`` apart."""
    found: list[tuple[float, int, int, float]] = []
    anchor: tuple[float, int] | None = None
    for t, step, _ in points:
        if anchor is None or step < anchor[1]:
            anchor = (t, step)  # the first point, or the rank's steps restarted
            continue
        if t - anchor[0] >= _MIN_SEGMENT_S and step > anchor[1]:
            found.append((anchor[0], anchor[1], step, (t - anchor[0]) / (step - anchor[1])))
            anchor = (t, step)
    return found


def check_rank(
    rank: int,
    points: Iterable[tuple[float, int, float]],
    first_step: int,
    stop_step: int,
    threshold: float,
    steps: int,
    done_at: float | None = None,
) -> RankPostWindow:
    """One rank's check from its points; ``first_step``: where the window's warmup begins;
    ``done_at``: when the rank finished its window (unix time; None: not yet, so nothing is after)."""
    segs = segments(points)
    before = [s for s in segs if s[2] <= first_step][-_BASELINE_SEGMENTS:]
    if not before:
        return RankPostWindow(rank=rank, verdict="pending")
    base = statistics.median(s[3] for s in before)
    slow = slow_segments = 0
    seen: list[float] = []
    verdict: Verdict = "pending"
    after = [s for s in segs if s[1] >= stop_step and done_at is not None and s[0] >= done_at]
    for _, begin, end, step_s in after:
        seen.append(step_s)
        if step_s > threshold * base:
            slow += end - begin
            slow_segments += 1
            if slow > steps and slow_segments >= _MIN_SLOW_SEGMENTS:
                verdict = "slower"
                break
        else:
            verdict, slow = "ok", 0
            break
    after_s = statistics.median(seen) if seen else None
    return RankPostWindow(
        rank=rank,
        before_s=base,
        after_s=after_s,
        ratio=after_s / base if after_s is not None and base > 0 else None,
        slow_steps=slow,
        verdict=verdict,
    )


def summarize(ranks: list[RankPostWindow], threshold: float, steps: int) -> PostWindowCheck:
    verdict: Verdict = max((r.verdict for r in ranks), key=_RANK_ORDER.__getitem__, default="unknown")
    slower = [r.rank for r in ranks if r.verdict == "slower"]
    if slower:
        worst = max((r.ratio or 0.0) for r in ranks if r.verdict == "slower")
        detail = (
            f"the profiler may not have let go: ranks {slower} stayed over {threshold:g}x their step time before "
            f"the window for more than {steps} steps after it (up to {worst:.2f}x). torch.profiler itself leaves "
            f"this in a CUDA process whose steps launch many small kernels (windows taken with torch.profiler alone left an "
            f"H200's launch-bound steps 1.2-1.4x slower; pytorch/pytorch#144455); restarting the workers from a "
            f"checkpoint clears it"
        )
    elif verdict == "pending":
        detail = f"waiting for {steps} steps after the window on every rank"
    elif verdict == "unknown":
        detail = "not enough steps before and after the window to compare (the run ended or stopped)"
    else:
        ratios = [r.ratio for r in ranks if r.ratio is not None]
        detail = f"every rank back within {threshold:g}x of its step time before the window" + (
            f" (at most {max(ratios):.2f}x)" if ratios else ""
        )
    return PostWindowCheck(threshold=threshold, steps=steps, verdict=verdict, ranks=ranks, detail=detail)


def awaits_check(profile: Record) -> bool:
    """Whether ``profile`` captured a window whose post-window check has no verdict yet."""
    if not isinstance(profile, Profile):  # a stacks bundle has no window
        return False
    done = profile.post_window is not None and profile.post_window.final
    return profile.window is not None and profile.capture_started_at is not None and not done


@dataclass
class _Tracked:
    profile: Profile
    since: float
    ranks: dict[int, RankPostWindow] = field(default_factory=dict)


class PostWindowChecks:
    """Follows every window from its capture until each rank has a verdict.

    ``settings``: (threshold, steps, monitor interval); ``finished``: called once per profile
    with its final check (to save it and export it).
    """

    def __init__(
        self,
        history: History,
        settings: Callable[[], tuple[float, int, float]],
        finished: Callable[[Profile, PostWindowCheck], None],
    ) -> None:
        self._history = history
        self._settings = settings
        self._finished = finished
        self._tracked: dict[str, _Tracked] = {}
        self._read_at = float("-inf")

    def track(self, profile: Profile, wall: float) -> None:
        """Follow ``profile`` if it captured a window and has no final check yet; ``wall``: since when
        (a check gives up once its history no longer reaches back to then)."""
        if awaits_check(profile):
            self._tracked.setdefault(profile.id, _Tracked(profile, wall))

    def tick(self, live: Iterable[Profile], wall: float) -> None:
        for profile in live:
            self.track(profile, wall)
        threshold, steps, interval_s = self._settings()
        if wall - self._read_at < _EVERY_TICKS * interval_s:
            return
        self._read_at = wall
        for profile_id, tracked in list(self._tracked.items()):
            check = self._check(tracked, wall, threshold, steps)
            tracked.profile.post_window = check
            if check.final:
                del self._tracked[profile_id]
                logger.info("rayprof controller: %s after its window: %s", profile_id, check.detail)
                self._finished(tracked.profile, check)

    def end(self, profile: Profile) -> None:
        """End ``profile``'s check as it stands: every rank without a verdict is ``unknown``."""
        threshold, steps, _ = self._settings()
        known = {r.rank: r for r in profile.post_window.ranks} if profile.post_window is not None else {}
        ranks = [known.get(rank, RankPostWindow(rank=rank)) for rank in sorted(profile.ranks)]
        ranks = [r.model_copy(update={"verdict": "unknown"}) if r.verdict == "pending" else r for r in ranks]
        self._tracked.pop(profile.id, None)
        profile.post_window = summarize(ranks, threshold, steps)
        self._finished(profile, profile.post_window)

    def _check(self, tracked: _Tracked, wall: float, threshold: float, steps: int) -> PostWindowCheck:
        profile = tracked.profile
        window = profile.window
        assert window is not None
        run = self._history.runs.get((profile.target, profile.run or ""))
        give_up = run is None or wall - tracked.since > _GIVE_UP_S or wall - run.last_t > _LOOKBACK_S
        since = (profile.scheduled_at.timestamp() if profile.scheduled_at else tracked.since) - _LOOKBACK_S
        first = window.start_step - profile.request.warmup
        for rank, outcome in profile.ranks.items():
            if rank in tracked.ranks and tracked.ranks[rank].verdict != "pending":
                continue
            history = run.ranks.get(rank) if run is not None else None
            done_at = outcome.finished_at.timestamp() if outcome.finished_at is not None else None
            result = (
                check_rank(rank, history.points(0, since), first, window.stop_step, threshold, steps, done_at)
                if history is not None
                else RankPostWindow(rank=rank)
            )
            if give_up and result.verdict == "pending":
                result = result.model_copy(update={"verdict": "unknown"})
            tracked.ranks[rank] = result
        return summarize([tracked.ranks[r] for r in sorted(tracked.ranks)], threshold, steps)
