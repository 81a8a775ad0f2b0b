"""Two profiles of one job, before and after a change: did it help, and where?

Pure functions over two :class:`DiffInput` (an analysis :class:`Summary`, the
request's options when known, and each rank's op table when stored). Loading
them from a folder or from storage is :mod:`orchestrator.analysis.diff_inputs`.

How a change is claimed (see :mod:`orchestrator.analysis.significance`): the
per-step values of each side (step time, or one phase's time) are compared
with a two-sided Mann-Whitney U test, and a change is claimed only when
p < ``ALPHA`` *and* the medians differ by more than the steps' own spread
(the larger interquartile range) and by at least ``MIN_CHANGE`` of the first
profile's median step time. The test keeps a one-off slow step from making a
change; the floors keep a consistent but tiny shift (another process on the
host, clock drift) from being called one. With fewer than 4 steps on a side
no ordering can reach p < 0.05, and the verdict says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.profiler_cost import slowed_by_profiler
from orchestrator.analysis.significance import mann_whitney_p, min_p_value, quantile
from orchestrator.layout import parse_profiler_step
from orchestrator.models.analysis import PHASES, Finding, OpStat, Phase, RankSummary, Summary
from orchestrator.models.requests import PER_OP_OPTIONS, ProfileOptions

__all__ = [
    "ALPHA",
    "MIN_CHANGE",
    "Change",
    "DiffInput",
    "Distribution",
    "FindingsDiff",
    "OpChange",
    "OpRow",
    "PhaseChange",
    "ProfileDiff",
    "ProfileRef",
    "RankDiff",
    "compare",
    "diff_profiles",
]

ALPHA = 0.05
MIN_CHANGE = 0.05
"""A change under 5% of the first profile's median step time is never claimed."""
TOP_CHANGES = 10
# Options that change what the profiler costs per step: two windows that differ in them measure different overheads.
_OVERHEAD_OPTIONS = ("activities", *PER_OP_OPTIONS)

Verdict = Literal["decreased", "increased", "unchanged", "too_few_steps"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OpRow(_Model):
    """One operator of a rank's op table (``ops/rank{R}.key_averages.csv``), summed over shapes."""

    name: str
    calls: int
    self_cpu_ms: float
    self_device_ms: float


class DiffInput(_Model):
    """One side of a comparison."""

    label: str = Field(description="Profile id or folder, as the user named it.")
    profile_id: str | None = None
    summary: Summary
    options: ProfileOptions | None = Field(default=None, description="The request's options, when a manifest says.")
    op_tables: dict[int, list[OpRow]] | None = Field(default=None, description="Per rank, when every rank has one.")


class Distribution(_Model):
    """Per-step values of one side, in milliseconds."""

    n: int
    median_ms: float
    q1_ms: float
    q3_ms: float

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


class Change(_Model):
    """A before/after comparison of per-step values, with its verdict."""

    a: Distribution | None
    b: Distribution | None
    delta_ms: float | None = Field(description="Median of b minus median of a.")
    delta_fraction: float | None = Field(description="delta_ms over a's median of the same quantity.")
    p_value: float | None = Field(description="Two-sided Mann-Whitney U test.")
    verdict: Verdict


class PhaseChange(_Model):
    phase: Phase
    change: Change


class RankDiff(_Model):
    rank: int
    step_time: Change
    phases: list[PhaseChange]


class OpChange(_Model):
    """An operator or kernel whose time per step moved the most."""

    name: str
    kind: Literal["op", "kernel"]
    status: Literal["added", "removed", "changed"]
    a_ms_per_step: float | None = Field(description="None: absent from a (or outside its top list, see bound).")
    b_ms_per_step: float | None
    delta_ms_per_step: float
    bound: bool = Field(
        default=False,
        description="A side outside its top list counts as its smallest listed entry: delta is an upper bound.",
    )


class FindingsDiff(_Model):
    resolved: list[Finding] = Field(description="Findings of a that b no longer has.")
    new: list[Finding] = Field(description="Findings of b that a did not have.")
    persisting: list[str] = Field(description="Codes found in both.")


class ProfileRef(_Model):
    label: str
    profile_id: str | None
    world_size: int | None
    ranks: list[int]
    steps: list[int]


class ProfileDiff(_Model):
    """``rayprof diff A B`` / ``GET /v1/profiles/{a}/diff/{b}``."""

    a: ProfileRef
    b: ProfileRef
    comparable: bool
    not_comparable: list[str] = Field(description="Why a change cannot be claimed, in plain words.")
    claims: list[str] = Field(description="What changed, one sentence each; empty when nothing did.")
    method: str
    step_time: Change
    phases: list[PhaseChange]
    ranks: list[RankDiff]
    ops: list[OpChange]
    kernels: list[OpChange]
    ops_source: Literal["op_table", "top_list"]
    findings: FindingsDiff
    notes: list[str] = Field(default_factory=list)


METHOD = (
    f"Per-step values compared with a two-sided Mann-Whitney U test; a change is claimed when p < {ALPHA}, "
    "the medians differ by more than the larger interquartile range, and by at least "
    f"{MIN_CHANGE:.0%} of A's median step time. The job's step time is the slowest rank's each step."
)


def _distribution(values: Sequence[float]) -> Distribution | None:
    if not values:
        return None
    return Distribution(
        n=len(values), median_ms=quantile(values, 0.5), q1_ms=quantile(values, 0.25), q3_ms=quantile(values, 0.75)
    )


def compare(a: Sequence[float], b: Sequence[float], *, scale_ms: float | None = None) -> Change:
    """Compare per-step values; ``scale_ms`` (default a's median) sets the smallest change worth claiming."""
    da, db = _distribution(a), _distribution(b)
    if da is None or db is None:
        return Change(a=da, b=db, delta_ms=None, delta_fraction=None, p_value=None, verdict="too_few_steps")
    delta = db.median_ms - da.median_ms
    fraction = delta / da.median_ms if da.median_ms > 0 else None
    p = mann_whitney_p(a, b)
    floor = max(MIN_CHANGE * (scale_ms if scale_ms is not None else da.median_ms), da.iqr_ms, db.iqr_ms)
    verdict: Verdict
    if min_p_value(len(a), len(b)) >= ALPHA:
        verdict = "too_few_steps"
    elif p < ALPHA and abs(delta) > floor:
        verdict = "decreased" if delta < 0 else "increased"
    else:
        verdict = "unchanged"
    return Change(a=da, b=db, delta_ms=delta, delta_fraction=fraction, p_value=p, verdict=verdict)


def _steps_by_number(summary: Summary) -> dict[int, list[RankSummary]]:
    common = set(summary.steps)
    by_step: dict[int, list[RankSummary]] = {s: [] for s in common}
    for rank in summary.ranks:
        for step in rank.steps:
            if step.step in common:
                by_step[step.step].append(rank)
    return by_step


def _job_step_times(summary: Summary) -> list[float]:
    """The job's time per step: its slowest rank's, over the steps every rank recorded."""
    per_step: dict[int, float] = {}
    for rank in summary.ranks:
        for step in rank.steps:
            if step.step in summary.steps:
                per_step[step.step] = max(per_step.get(step.step, 0.0), step.duration_ms)
    return [per_step[s] for s in sorted(per_step)]


def _job_phase_times(summary: Summary, phase: Phase) -> list[float]:
    """Mean over ranks of ``phase`` per step, over the steps every rank recorded."""
    per_step: dict[int, list[float]] = {}
    for rank in summary.ranks:
        for step in rank.steps:
            if step.step in summary.steps:
                per_step.setdefault(step.step, []).append(step.phases.get(phase))
    return [sum(v) / len(v) for _, v in sorted(per_step.items())]


def _phase_changes(
    a: Callable[[Phase], list[float]], b: Callable[[Phase], list[float]], scale: float | None
) -> list[PhaseChange]:
    return [PhaseChange(phase=p, change=compare(a(p), b(p), scale_ms=scale)) for p in PHASES]


def _rank_diff(ra: RankSummary, rb: RankSummary) -> RankDiff:
    durations_a = [s.duration_ms for s in ra.steps]
    step_time = compare(durations_a, [s.duration_ms for s in rb.steps])
    scale = step_time.a.median_ms if step_time.a else None
    phases = _phase_changes(
        lambda p: [s.phases.get(p) for s in ra.steps], lambda p: [s.phases.get(p) for s in rb.steps], scale
    )
    return RankDiff(rank=ra.rank, step_time=step_time, phases=phases)


def _not_comparable(a: DiffInput, b: DiffInput) -> list[str]:
    sa, sb = a.summary, b.summary
    reasons = []
    if sa.world_size != sb.world_size:
        reasons.append(f"different world size: {sa.world_size} vs {sb.world_size}")
    ranks_a, ranks_b = sorted(r.rank for r in sa.ranks), sorted(r.rank for r in sb.ranks)
    if ranks_a != ranks_b:
        reasons.append(f"different ranks analysed: {ranks_a} vs {ranks_b}")
    if len(sa.steps) != len(sb.steps):
        reasons.append(f"different number of steps: {len(sa.steps)} vs {len(sb.steps)}")
    if not sa.steps or not sb.steps:
        reasons.append("one profile has no step every rank recorded")
    if a.options is not None and b.options is not None:
        for name in _OVERHEAD_OPTIONS:
            va, vb = getattr(a.options, name), getattr(b.options, name)
            if va != vb:
                reasons.append(f"different profiler option {name}: {va} vs {vb} (it changes the profiler's overhead)")
    return reasons + [why for side in (a, b) if (why := slowed_by_profiler(side.label, side.summary.ranks))]


def _per_step(rows: dict[str, float], steps: int) -> dict[str, float]:
    return {name: ms / max(steps, 1) for name, ms in rows.items()}


def _op_totals(side: DiffInput, kind: Literal["op", "kernel"]) -> tuple[dict[str, float], float | None]:
    """Mean over ranks of ms per step by name; and, for a top list, its smallest entry (the bound for the rest)."""
    ranks = side.summary.ranks
    totals: dict[str, float] = {}
    smallest: float | None = None
    for rank in ranks:
        steps = len(rank.steps)
        if kind == "op" and side.op_tables is not None:
            rows = {r.name: r.self_cpu_ms for r in side.op_tables.get(rank.rank, [])}
        else:
            stats: list[OpStat] = rank.top_ops if kind == "op" else rank.top_kernels
            rows = {s.name: s.total_ms for s in stats}
            if stats:
                low = min(s.total_ms for s in stats) / max(steps, 1)
                smallest = low if smallest is None else max(smallest, low)
        for name, ms in _per_step(rows, steps).items():
            if parse_profiler_step(name) is None:
                totals[name] = totals.get(name, 0.0) + ms / len(ranks)
    return totals, smallest


def _op_changes(a: DiffInput, b: DiffInput, kind: Literal["op", "kernel"], floor_ms: float) -> list[OpChange]:
    ta, bound_a = _op_totals(a, kind)
    tb, bound_b = _op_totals(b, kind)
    changes = []
    for name in set(ta) | set(tb):
        va, vb = ta.get(name), tb.get(name)
        # Missing from a complete table means absent; missing from a top list means at most its smallest entry.
        ea = va if va is not None else (bound_a or 0.0)
        eb = vb if vb is not None else (bound_b or 0.0)
        delta = eb - ea
        if abs(delta) < floor_ms:
            continue
        status = "added" if va is None else "removed" if vb is None else "changed"
        bounded = (va is None and bound_a is not None) or (vb is None and bound_b is not None)
        changes.append(
            OpChange(
                name=name,
                kind=kind,
                status=status,
                a_ms_per_step=va,
                b_ms_per_step=vb,
                delta_ms_per_step=delta,
                bound=bounded,
            )
        )
    return sorted(changes, key=lambda c: -abs(c.delta_ms_per_step))[:TOP_CHANGES]


def _findings(a: Summary, b: Summary) -> FindingsDiff:
    codes_a, codes_b = {f.code for f in a.findings}, {f.code for f in b.findings}
    return FindingsDiff(
        resolved=[f for f in a.findings if f.code not in codes_b],
        new=[f for f in b.findings if f.code not in codes_a],
        persisting=sorted(codes_a & codes_b),
    )


def _fmt_change(what: str, change: Change) -> str:
    assert change.a is not None and change.b is not None and change.delta_ms is not None
    word = "shrank" if change.verdict == "decreased" else "grew"
    pct = f", {change.delta_fraction:+.0%}" if change.delta_fraction is not None else ""
    return (
        f"{what} {word} by {abs(change.delta_ms):.2f} ms per step ({change.a.median_ms:.2f} -> "
        f"{change.b.median_ms:.2f} ms median{pct}, p={change.p_value:.3f})"
    )


def _claims(step_time: Change, phases: list[PhaseChange], ranks: list[RankDiff]) -> list[str]:
    claims = []
    if step_time.verdict in ("decreased", "increased"):
        claims.append(_fmt_change("step time", step_time))
    for pc in sorted(phases, key=lambda pc: -abs(pc.change.delta_ms or 0.0)):
        if pc.change.verdict in ("decreased", "increased"):
            claims.append(_fmt_change(f"phase {pc.phase}", pc.change))
    if len(ranks) > 1:
        for rd in ranks:
            if rd.step_time.verdict in ("decreased", "increased") and rd.step_time.verdict != step_time.verdict:
                claims.append(_fmt_change(f"rank {rd.rank} step time", rd.step_time))
    return claims


def _ref(side: DiffInput) -> ProfileRef:
    s = side.summary
    return ProfileRef(
        label=side.label,
        profile_id=side.profile_id,
        world_size=s.world_size,
        ranks=[r.rank for r in s.ranks],
        steps=list(s.steps),
    )


def diff_profiles(a: DiffInput, b: DiffInput) -> ProfileDiff:
    """Compare profile ``b`` (after) with profile ``a`` (before)."""
    reasons = _not_comparable(a, b)
    step_time = compare(_job_step_times(a.summary), _job_step_times(b.summary))
    scale = step_time.a.median_ms if step_time.a else None
    phases = _phase_changes(lambda p: _job_phase_times(a.summary, p), lambda p: _job_phase_times(b.summary, p), scale)
    by_rank_b = {r.rank: r for r in b.summary.ranks}
    ranks = [_rank_diff(ra, by_rank_b[ra.rank]) for ra in a.summary.ranks if ra.rank in by_rank_b]
    notes = []
    complete = a.op_tables is not None and b.op_tables is not None
    if not complete:
        notes.append(
            "operators come from each rank's top list (no op tables on both sides): an operator outside a top list "
            "counts as that list's smallest entry, so its change is a bound"
        )
    if a.options is None or b.options is None:
        notes.append("the profiler options of a folder without a manifest are unknown and were not compared")
    # Operators under 1% of the step are noise at this resolution.
    op_floor = 0.01 * scale if scale else 0.0
    return ProfileDiff(
        a=_ref(a),
        b=_ref(b),
        comparable=not reasons,
        not_comparable=reasons,
        claims=[] if reasons else _claims(step_time, phases, ranks),
        method=METHOD,
        step_time=step_time,
        phases=phases,
        ranks=ranks,
        ops=_op_changes(
            a.model_copy(update={"op_tables": a.op_tables if complete else None}),
            b.model_copy(update={"op_tables": b.op_tables if complete else None}),
            "op",
            op_floor,
        ),
        kernels=_op_changes(a, b, "kernel", op_floor),
        ops_source="op_table" if complete else "top_list",
        findings=_findings(a.summary, b.summary),
        notes=notes,
    )
