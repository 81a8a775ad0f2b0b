"""The client's models in the compact shapes of :mod:`orchestrator.mcp.results`.

Pure functions: no client call, no I/O, so each is tested without a cluster.
Locations go through :func:`orchestrator.mcp.bounds.public_uri` (no credential
leaves in an answer) and artifact lists are left out (the manifest resource has them).
"""

from __future__ import annotations

import re
import statistics

from orchestrator.analysis.diff import ProfileDiff
from orchestrator.analysis.finding_base import verdict
from orchestrator.analysis.step_content import one_step
from orchestrator.mcp.bounds import public_uri
from orchestrator.mcp.results import (
    Analysis,
    DiffResult,
    HistoryResult,
    ProfileBrief,
    ProfileList,
    ProfileResult,
    RankAnalysis,
    RankDiffBrief,
    RankNow,
    RankOutcome,
    RankPoints,
    StackGroupBrief,
    StacksResult,
    TargetBrief,
    TargetList,
    WatchBrief,
    WatchList,
)
from orchestrator.models.analysis import Summary
from orchestrator.models.control import TargetInfo, no_targets_note
from orchestrator.models.diagnosis import StacksBundle, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.summaries import ProfilePage

__all__ = [
    "FRAMES_PER_GROUP",
    "analysis_of",
    "diff_result",
    "history_result",
    "manifest_resource",
    "profile_list",
    "profile_result",
    "report_resource",
    "stacks_result",
    "target_list",
    "watch_brief",
    "watch_list",
]

FRAMES_PER_GROUP = 8
"""Innermost frames shown per stack group: where it is and what called it; the bundle keeps all."""
TOP_OPS = 8
FIRINGS_SHOWN = 3


def manifest_resource(profile_id: str) -> str:
    return f"rayprof://profiles/{profile_id}/manifest"


def report_resource(profile_id: str) -> str:
    return f"rayprof://profiles/{profile_id}/report"


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None


def target_list(targets: list[TargetInfo]) -> TargetList:
    # Stalled and lagging runs first: what an agent asked about is most likely there.
    ordered = sorted(targets, key=lambda t: (t.health != "STALLED", not t.lagging_ranks, t.name))
    return TargetList(
        targets=[
            TargetBrief(
                name=t.name,
                run=t.run,
                world_size=t.world_size,
                health=t.health,
                stalled_s=t.stalled_s,
                median_step_time_ms=_ms(t.median_step_time_s),
                lagging_ranks=t.lagging_ranks,
                active_profile=t.active_profile,
                queued_profiles=t.queued_profiles,
                stall_stacks=t.stall_stacks,
                stall_verdict=t.stall_verdict,
                other_build_ranks=t.other_build_ranks,
                ranks=[
                    RankNow(rank=r.info.world_rank, step=r.step, step_time_ms=_ms(r.step_time_s))
                    for r in sorted(t.ranks, key=lambda r: (r.step, -(r.step_time_s or 0.0), r.info.world_rank))
                ],
            )
            for t in ordered
        ],
        note=no_targets_note(len(targets)),
    )


def analysis_of(manifest: Manifest) -> Analysis | None:
    """A profile manifest's analysis; ``None`` for a stacks bundle or a window with no summary."""
    summary = manifest.summary
    if not isinstance(summary, Summary):
        if manifest.analysis_error is None or manifest.kind != "profile":
            return None
        return Analysis(
            profile_id=manifest.profile_id, verdict=f"No analysis: {manifest.analysis_error}", steps=[], findings=[],
            stragglers=[], step_spread=None, ranks=[], issues=[], analysis_error=manifest.analysis_error,
        )
    return summary_analysis(summary, manifest.profile_id, manifest)


def summary_analysis(summary: Summary, profile_id: str, manifest: Manifest | None = None) -> Analysis:
    """A summary's analysis, named ``profile_id`` (a stored profile's id, or the folder a local one was read
    from); ``manifest`` says what the agent counted as one step where there is one."""
    stragglers = [s.rank for s in summary.stragglers]
    ranks = [
        RankAnalysis(
            rank=r.rank,
            mean_step_ms=r.mean_step_ms,
            median_step_ms=r.median_step_ms,
            phases_ms=r.mean_phases,
            comm_wait_ms=r.comm_wait_ms,
            waits_for_others_ms=r.waits_for_others_ms,
            idle_ms_per_step=r.idle.idle_ms_per_step if r.idle is not None else None,
            idle_causes=list(r.idle.causes) if r.idle is not None else [],
        )
        # Stragglers first, then the busiest: ranks in lockstep share one step time, and the
        # fast ones spend theirs waiting for the others.
        for r in sorted(
            summary.ranks,
            key=lambda r: (r.rank not in stragglers, -((r.median_step_ms or 0.0) - r.waits_for_others_ms), r.rank),
        )
    ]
    return Analysis(
        profile_id=profile_id,
        steps=summary.steps,
        one_step=one_step(summary, manifest),
        verdict=verdict(summary),
        caution=summary.caution,
        findings=sorted(summary.findings, key=lambda f: -f.max_saving_ms),
        stragglers=summary.stragglers,
        slow_groups=summary.slow_groups,
        step_spread=summary.step_spread,
        ranks=ranks,
        issues=summary.issues,
        analysis_error=manifest.analysis_error if manifest is not None else None,
    )


def _next_step(status: ProfileStatus) -> str:
    if not status.state.is_terminal:
        return f"still {status.state.value}: call get_profile with profile_id={status.id!r} (wait=true) for its end"
    if status.kind == "stacks":
        return "read the verdict with take_stacks' answer, or the manifest resource for every rank's frames"
    if status.state.value in ("DONE", "PARTIAL"):
        return "findings are in `analysis`; diff it against another profile of the same target to see what changed"
    return f"the window ended {status.state.value}: see `reason` and the ranks' reasons"


def profile_result(status: ProfileStatus, manifest: Manifest | None) -> ProfileResult:
    ended = manifest is not None
    return ProfileResult(
        id=status.id,
        kind=status.kind,
        target=status.target,
        run=status.run,
        state=status.state.value,
        reason=status.reason,
        trigger=status.trigger,
        start_step=status.start_step,
        stop_step=status.stop_step,
        ranks=[
            RankOutcome(rank=r.rank, state=r.state.value, reason=r.reason, steps_recorded=len(r.step_durations_ms))
            for r in sorted(status.ranks, key=lambda r: (r.state.value == "DONE", r.rank))
        ],
        manifest_uri=public_uri(status.manifest_uri),
        manifest_resource=manifest_resource(status.id) if ended else None,
        report_resource=report_resource(status.id) if ended and status.kind == "profile" else None,
        analysis=analysis_of(manifest) if manifest is not None else None,
        next=_next_step(status),
    )


def profile_list(page: ProfilePage) -> ProfileList:
    return ProfileList(
        total=page.total,
        profiles=[
            ProfileBrief(
                id=p.id,
                kind=p.kind,
                target=p.target,
                state=p.state.value,
                created_at=p.created_at,
                steps=p.steps,
                trigger=p.trigger.kind if p.trigger is not None else None,
            )
            for p in page.profiles
        ],
    )


_INSTALLED = re.compile(r".*/(?:site-packages|dist-packages|lib/python3\.\d+)/")


def _short(filename: str) -> str:
    """An installed package's or the standard library's file from the package on (``ray/train/...``,
    ``threading.py``): the install prefix is noise an agent pays for in every frame."""
    return _INSTALLED.sub("", filename, count=1)


def stacks_result(bundle: StacksBundle, target: TargetInfo | None) -> StacksResult:
    groups = [
        StackGroupBrief(
            ranks_text=g.ranks_text,
            where=g.where,
            waiting=g.waiting,
            activity=g.activity,
            majority=g.majority,
            # Frames are outermost first (a traceback); the innermost say where it is.
            frames=[f"{_short(f.filename)}:{f.line} in {f.function}" for f in reversed(g.frames[-FRAMES_PER_GROUP:])],
        )
        for g in bundle.groups
    ]
    return StacksResult(
        id=bundle.id,
        target=bundle.target,
        verdict=bundle.summary,
        health=target.health if target is not None else None,
        stalled_s=target.stalled_s if target is not None else None,
        groups=groups,
        collectives=bundle.collectives,
        missing=[f"rank {m.rank}: {m.reason}" for m in bundle.missing],
    )


def diff_result(diff: ProfileDiff) -> DiffResult:
    return DiffResult(
        a=diff.a.profile_id or diff.a.label,
        b=diff.b.profile_id or diff.b.label,
        comparable=diff.comparable,
        not_comparable=diff.not_comparable,
        claims=diff.claims,
        step_time=diff.step_time,
        phases=diff.phases,
        ranks=[RankDiffBrief(rank=r.rank, step_time=r.step_time) for r in diff.ranks],
        ops=diff.ops[:TOP_OPS],
        kernels=diff.kernels[:TOP_OPS],
        resolved_findings=[f.code for f in diff.findings.resolved],
        new_findings=[f.code for f in diff.findings.new],
    )


def _buckets(n: int, max_points: int) -> list[range]:
    """``n`` points in at most ``max_points`` consecutive buckets of (nearly) equal size."""
    count = min(n, max_points)
    return [range(i * n // count, (i + 1) * n // count) for i in range(count)] if count else []


def history_result(history: TargetHistory, max_points: int) -> HistoryResult:
    """Each rank's points averaged into at most ``max_points`` buckets (whatever the server sent)."""
    ranks: list[RankPoints] = []
    widest = 1
    for series in history.ranks:
        buckets = _buckets(len(series.t), max_points)
        widest = max(widest, max((len(b) for b in buckets), default=1))
        times, values = [], []
        for bucket in buckets:
            times.append(round(series.t[bucket[-1]], 3))
            known = [series.step_time_s[i] for i in bucket if series.step_time_s[i] is not None]
            values.append(_ms(statistics.fmean(known)) if known else None)  # type: ignore[arg-type]
        known_all = [v for v in series.step_time_s if v is not None]
        median = _ms(statistics.median(known_all)) if known_all else None
        ranks.append(RankPoints(rank=series.rank, t=times, step_time_ms=values, median_step_time_ms=median))
    ranks.sort(key=lambda r: -(r.median_step_time_ms or 0.0))
    return HistoryResult(
        target=history.target,
        run=history.run,
        span_s=history.span_s,
        resolution_s=history.resolution_s * widest,
        ranks_total=history.ranks_total if history.ranks_total is not None else len(ranks),
        ranks=ranks,
    )


def _firing(w: WatchStatus) -> list[str]:
    shown = []
    for f in reversed(w.firings[-FIRINGS_SHOWN:]):
        what = f"took {f.profile_id}" if f.profile_id else f"could not act: {f.error}"
        shown.append(f"{f.at.isoformat(timespec='seconds')}: {f.trigger.detail}; {what}")
    return shown


def watch_brief(w: WatchStatus) -> WatchBrief:
    return WatchBrief(
        id=w.id, spec=w.spec, state=w.state, observed=w.observed, baseline=w.baseline, note=w.paused or w.note,
        last_firings=_firing(w),
    )


def watch_list(watches: list[WatchStatus]) -> WatchList:
    return WatchList(watches=[watch_brief(w) for w in watches])
