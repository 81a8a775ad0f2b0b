"""Who is the culprit, measured: planted multi-rank cases built from real traces, scored against ``cross.stragglers``.

Templates are real GPU steps: rayprof's own per-step breakdowns of the traces
in ``../shared/external-traces`` that hold collectives (PARAM's DLRM, 8 ranks
on V100, one step each; HTA's A100 and V100 samples; TraceLens' MI300
ResNet). From each real step come its busy phases (data, forward, backward,
optimizer, copies, the host's syncs less the collective wait they hide,
other) and the template's least wait in collectives (its all-reduce's own
transfer time).

A set of ``N`` ranks (8 to 256) runs ``STEPS`` steps of synchronous data
parallelism on those real steps, DDP's lockstep: at step ``s`` every rank
does real step ``s mod K`` of its template (the real variation over time),
each phase scaled by a lasting factor of the rank's own (sd ``RANK_SPREAD``,
2%: one GPU of a model runs a few percent slower than another of the same
kind) and one of the step's (sd ``JITTER``, 5%); at 256 ranks the healthy
busiest rank is then ~10% over the typical one. (PARAM's eight DLRM ranks
differ by 10% sd, but DLRM shards its embeddings: ranks do different work,
which is not the data-parallel case planted here.) Its work before
the gradient all-reduce (data, forward, backward, copies, syncs, other) ends
at ``start + pre``; the all-reduce ends for every rank at ``max(ready) +
transfer``; then the rank's optimizer runs and its next step starts up to
``START_JITTER_MS`` later, with its clock off by a residual of the merged
trace's alignment. A rank's comm phase is its wait plus the transfer: a
straggler shows as the *others'* wait, and every step time evens out.

Planted faults, of ``m`` = 0.2, 0.5 or 1.0 times the healthy set's median step
(the smallest just over the 15% a straggler must lose), on one random rank
``k`` whose lasting factor is 1 (so the fault is what sets it apart):

* ``forward`` / ``data`` / ``backward``: ``k``'s phase grows by ``m`` inside
  its step (backward: the all-reduce waits for it and evens the others out);
* ``optimizer``: ``k``'s optimizer grows by ``m``, after the all-reduce: its
  step is longer, and it starts the next one late (the others wait for it there);
* ``slow_node``: ``forward`` on all eight ranks of one node (sets of 32 ranks
  and more): eight culprits;
* ``late_start``: ``k`` starts each step ``m`` late (work between steps,
  outside the profiler's step span: the others wait in the all-reduce);
* ``slow_link``: the ring link between ``k`` and ``k + 1`` makes the
  all-reduce ``m`` slower *for every rank* (a ring moves at its slowest link);
  nobody is late or busier, so no rank is to blame from step data, and naming
  one is a false culprit;
* ``moving``: each step a random rank's forward grows by ``m`` (batches of
  uneven size; ``imbalance.moving_imbalance`` tells it). No rank is to blame,
  but a rank drawn in half of the 8 steps is, by the window's data, slow in
  half of them: its rate of named ranks is shown, without a target;
* ``healthy``: nothing planted.

Mesh sets (32 to 256 ranks, :func:`build_mesh_set`) add a second level of
process groups, as tensor- and data-parallel jobs have: a slow link inside one
group (a node's, or one across nodes) must be named as that group
(``groups.slow_groups``) with no rank blamed, a straggler must be named with none
of its groups, and a healthy set must name nothing. Faults there start at
0.1 x the step for a slow link (it costs the job without any rank standing
out), at the other faults' 0.2 for a straggler.

Scored per set: the ranks ``cross.stragglers`` names against the planted
ones. Recall and precision over the one-rank faults; false-culprit rate over
the healthy and slow-link sets (any rank named). Bounded: about a minute on
2 cores (``--quick``: a few seconds).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from benchmarks import LogFn
from benchmarks._stats import REPO, Result
from orchestrator.analysis.groups import held_back, slow_groups
from orchestrator.models.analysis import PHASES, PhaseTimes, ProcessGroupComm, RankSummary, StepBreakdown

NAME = "culprit"
EXTERNAL = REPO.parent / "shared" / "external-traces"
TEMPLATES = (
    "param_dlrm_v100_8ranks",
    "hta_nccl_parser_a100_r0of2",
    "hta_negative_queue_a100_r0of16",
    "hta_trace_diff_control_a100_r3of8",
    "hta_trace_diff_test_v100_r1of2",
    "hta_df_index_resolver_v100_r1of2",
    "tracelens_mi300_resnet_ckpt_r0of8",
)
SIZES = (8, 32, 128, 256)
QUICK_SIZES = (8, 64)
STEPS = 8
MAGNITUDES = (0.2, 0.5, 1.0)
ONE_RANK_FAULTS = ("forward", "data", "backward", "optimizer", "late_start", "slow_node")
_PHASE_FAULTS = ("forward", "data", "backward", "optimizer", "slow_node")
NODE = 8
BLAMELESS = ("healthy", "slow_link")
JITTER = 0.05
RANK_SPREAD = 0.02
START_JITTER_MS = 0.05
CLOCK_RESIDUAL_MS = 0.02
RECALL_TARGET = 0.99
_PRE = ("data", "forward", "backward", "memcpy", "sync", "other")
# Mesh sets (two-level parallelism): faults planted, and how much of the template's transfer each level's collective takes.
MESH_FAULTS = ("healthy", "forward", "backward", "slow_link_tp", "slow_link_dp")
MESH_SIZES = (32, 128, 256)
QUICK_MESH_SIZES = (64,)
MESH_MAGNITUDES = (0.1, 0.2, 0.5)
TP_SHARE = 0.5
GROUP_SPREAD = 0.03


@dataclass(frozen=True)
class RealStep:
    """One real step's busy phases (ms, no comm) and its template's all-reduce transfer time."""

    busy: dict[str, float]
    transfer_ms: float


@dataclass(frozen=True)
class Template:
    name: str
    steps: list[RealStep]
    median_step_ms: float


def load_template(case: str) -> Template:
    """Real steps of one external trace folder, as rayprof's per-rank analysis breaks them down."""
    from orchestrator.analysis import analyze_folder

    summary = analyze_folder(EXTERNAL / case / "traces")
    real = [s for r in summary.ranks if r.window == "profiler_steps" for s in r.steps]
    waits = [s.phases.comm + (s.comm_exposed_ms or 0.0) for s in real]
    transfer = min(waits)
    steps = []
    for s in real:
        busy = {p: s.phases.get(p) for p in PHASES if p != "comm"}
        # The host's syncs wait (partly) for the collective on the device: that share is wait, not work.
        busy["sync"] = max(0.0, busy["sync"] - (s.comm_exposed_ms or 0.0))
        steps.append(RealStep(busy=busy, transfer_ms=transfer))
    # The healthy synthetic step (busy + transfer) is what a planted fault's size is relative to.
    return Template(case, steps, statistics.median(sum(s.busy.values()) + s.transfer_ms for s in steps))


def build_set(template: Template, n: int, fault: str, magnitude: float, rng: random.Random) -> tuple[list[RankSummary], set[int]]:
    """``n`` ranks in lockstep on the template's real steps, with ``fault`` planted; returns them and the culprits."""
    k = rng.randrange(n)
    culprits = {k - k % NODE + i for i in range(NODE)} if fault == "slow_node" else {k}
    extra = magnitude * template.median_step_ms
    size = len(template.steps)
    starts = [rng.uniform(0, START_JITTER_MS) for _ in range(n)]
    # A culprit's GPU is a typical one: the fault is all that sets it apart, so a fault of m is what it loses.
    own = [1.0 if r in culprits else 1 + rng.gauss(0, RANK_SPREAD) for r in range(n)]
    per_rank: list[list[StepBreakdown]] = [[] for _ in range(n)]
    for s in range(STEPS):
        busy = []
        mover = rng.randrange(n) if fault == "moving" else None
        for r in range(n):
            real = template.steps[s % size]
            phases = {p: v * max(0.0, own[r] + rng.gauss(0, JITTER)) for p, v in real.busy.items()}
            if r in culprits and fault in _PHASE_FAULTS:
                phases["forward" if fault == "slow_node" else fault] += extra
            if r == mover:
                phases["forward"] += extra
            busy.append(phases)
        if fault == "late_start":
            starts[k] += extra
        ready = [starts[r] + sum(busy[r][p] for p in _PRE) for r in range(n)]
        transfer = template.steps[s % size].transfer_ms + (extra if fault == "slow_link" else 0.0)
        done = max(ready) + transfer
        for r in range(n):
            phases = dict(busy[r], comm=done - ready[r])
            end = done + phases["optimizer"]
            clock = rng.gauss(0, CLOCK_RESIDUAL_MS)
            per_rank[r].append(
                StepBreakdown(
                    step=100 + s,
                    start_unix_us=(starts[r] + clock) * 1000,
                    duration_ms=end - starts[r],
                    phases=PhaseTimes(**phases),
                )
            )
            starts[r] = end + rng.uniform(0, START_JITTER_MS)
    ranks = [_summary(r, steps) for r, steps in enumerate(per_rank)]
    return ranks, (culprits if fault in ONE_RANK_FAULTS else set())


def build_mesh_set(template: Template, n: int, fault: str, magnitude: float, rng: random.Random) -> tuple[list[RankSummary], set[int], str | None]:
    """``n`` ranks as nodes of ``NODE`` with two levels of groups, with ``fault`` planted; returns them, the culprit
    ranks and the slow group's name.

    Tensor-parallel groups are the nodes (``tp<node>``, one all-reduce at the end of forward taking ``TP_SHARE`` of
    the template's transfer); data-parallel groups are the ranks of one local index across nodes (``dp<index>``,
    the gradient all-reduce after backward). Each collective ends for its group at its last member's arrival plus
    its transfer, which has a lasting factor per group (sd ``GROUP_SPREAD``) and the step's jitter. ``slow_link_tp``
    / ``slow_link_dp`` make one group's transfer ``m`` of the step longer (a slow link inside it); ``forward`` /
    ``backward`` make rank ``k`` a straggler, whose groups must not be named.
    """
    k = rng.randrange(n)
    extra = magnitude * template.median_step_ms
    slow = f"tp{k // NODE}" if fault == "slow_link_tp" else f"dp{k % NODE}" if fault == "slow_link_dp" else None
    groups = [f"tp{i}" for i in range(n // NODE)] + [f"dp{i}" for i in range(NODE)]
    lasting = {g: 1 + rng.gauss(0, GROUP_SPREAD) for g in groups}
    own = [1.0 if r == k else 1 + rng.gauss(0, RANK_SPREAD) for r in range(n)]
    starts = [rng.uniform(0, START_JITTER_MS) for _ in range(n)]
    per_rank: list[list[StepBreakdown]] = [[] for _ in range(n)]
    for s in range(STEPS):
        real = template.steps[s % len(template.steps)]
        busy = [{p: v * max(0.0, own[r] + rng.gauss(0, JITTER)) for p, v in real.busy.items()} for r in range(n)]
        if fault in ("forward", "backward"):
            busy[k][fault] += extra

        def transfer(g: str, share: float, base: float = real.transfer_ms) -> float:
            return share * base * lasting[g] * max(0.0, 1 + rng.gauss(0, JITTER)) + (extra if g == slow else 0.0)

        ready1 = [starts[r] + busy[r]["data"] + busy[r]["forward"] for r in range(n)]
        tp_done = {f"tp{i}": max(ready1[i * NODE : (i + 1) * NODE]) + transfer(f"tp{i}", TP_SHARE) for i in range(n // NODE)}
        ready2 = [tp_done[f"tp{r // NODE}"] + sum(busy[r][p] for p in _PRE if p not in ("data", "forward")) for r in range(n)]
        dp_done = {f"dp{i}": max(ready2[i::NODE]) + transfer(f"dp{i}", 1.0) for i in range(NODE)}
        for r in range(n):
            tp, dp = f"tp{r // NODE}", f"dp{r % NODE}"
            waits = {tp: tp_done[tp] - ready1[r], dp: dp_done[dp] - ready2[r]}
            end = dp_done[dp] + busy[r]["optimizer"]
            per_rank[r].append(
                StepBreakdown(
                    step=100 + s, start_unix_us=(starts[r] + rng.gauss(0, CLOCK_RESIDUAL_MS)) * 1000, duration_ms=end - starts[r],
                    phases=PhaseTimes(**busy[r], comm=sum(waits.values())), group_comm_ms=waits,
                )
            )
            starts[r] = end + rng.uniform(0, START_JITTER_MS)
    ranks = []
    for r, steps in enumerate(per_rank):
        shape = [("mesh_tp", f"tp{r // NODE}", NODE), ("mesh_dp", f"dp{r % NODE}", n // NODE)]
        pgs = [ProcessGroupComm(name=g, description=d, size=size, calls_per_step=1, elements_per_step=1e6) for d, g, size in shape]
        ranks.append(_summary(r, steps, pgs))
    return ranks, ({k} if fault in ("forward", "backward") else set()), slow


def _summary(rank: int, steps: list[StepBreakdown], groups: list[ProcessGroupComm] | None = None) -> RankSummary:
    durations = [s.duration_ms for s in steps]
    mean = {p: statistics.fmean(s.phases.get(p) for s in steps) for p in PHASES}
    return RankSummary(
        rank=rank, host=f"node{rank // 8}", file=f"rank{rank}.pt.trace.json.gz", device="cuda", steps=steps,
        mean_step_ms=statistics.fmean(durations), median_step_ms=statistics.median(durations),
        mean_phases=PhaseTimes(**mean), comm_wait_ms=mean["comm"], process_groups=groups or [],
    )


@dataclass
class Score:
    """Counts over many sets of one kind."""

    sets: int = 0
    found: int = 0
    missed: int = 0
    wrong: int = 0
    sets_with_false_culprit: int = 0
    right_phase: int = 0

    def add(self, named: dict[int, str], expected: set[int], fault: str) -> None:
        self.sets += 1
        hit = expected & named.keys()
        self.found += len(hit)
        self.missed += len(expected - hit)
        false = named.keys() - expected
        self.wrong += len(false)
        self.sets_with_false_culprit += bool(false)
        self.right_phase += sum(named[r] == _PHASE_OF.get(fault, fault) for r in hit)


_PHASE_OF = {"slow_node": "forward", "late_start": "late_arrival"}


def cases(sizes: Sequence[int], seeds: int) -> Iterator[tuple[int, str, float, int]]:
    for n in sizes:
        for seed in range(seeds):
            for fault in ONE_RANK_FAULTS + ("slow_link", "moving"):
                if fault == "slow_node" and n < 4 * NODE:
                    continue
                for m in MAGNITUDES:
                    yield n, fault, m, seed
            for m in MAGNITUDES:  # as many healthy sets as of each fault
                yield n, "healthy", m, seed


def named_culprits(ranks: Sequence[RankSummary]) -> dict[int, str]:
    """Rank -> the phase (or ``late_arrival``) the analysis names (``cross.stragglers``, less the late arrivers
    another culprit holds back: ``groups.held_back``, as ``front`` applies it)."""
    from orchestrator.analysis.cross import stragglers

    named = held_back(stragglers(ranks), ranks, slow_groups(ranks))
    return {s.rank: (s.cause if s.cause == "late_arrival" else s.phase) for s in named}


def run(quick: bool, log: LogFn, templates: Sequence[str] = TEMPLATES) -> list[Result]:
    """Score every planted set; rows: recall, precision, false-culprit rate, per fault and overall."""
    t0 = time.perf_counter()
    loaded = [load_template(t) for t in templates]
    log(f"{NAME}: {len(loaded)} templates, {sum(len(t.steps) for t in loaded)} real steps in {time.perf_counter() - t0:.1f}s")
    scores: dict[str, Score] = {}
    by_size: dict[int, Score] = {}
    misses: list[str] = []
    for template in loaded:
        for n, fault, m, seed in cases(QUICK_SIZES if quick else SIZES, 1 if quick else 2):
            rng = random.Random(f"{template.name}/{n}/{fault}/{m}/{seed}")
            ranks, expected = build_set(template, n, fault, m, rng)
            named = named_culprits(ranks)
            scores.setdefault(fault, Score()).add(named, expected, fault)
            if fault in ONE_RANK_FAULTS:
                by_size.setdefault(n, Score()).add(named, expected, fault)
            if named.keys() != expected and len(misses) < 12:
                misses.append(f"{template.name} n={n} {fault} m={m} seed={seed}: planted {sorted(expected)}, named {named}")
    mesh: dict[str, MeshScore] = {}
    for template in loaded:
        for n, fault, m, seed in mesh_cases(QUICK_MESH_SIZES if quick else MESH_SIZES, 1 if quick else 2):
            ranks, expected, slow = build_mesh_set(template, n, fault, m, random.Random(f"{template.name}/mesh{n}/{fault}/{m}/{seed}"))
            named, groups = named_culprits(ranks), [g.name for g in slow_groups(ranks)]
            mesh.setdefault(fault, MeshScore()).add(set(named), expected, groups, slow)
            if (set(named) != expected or groups != ([slow] if slow else [])) and len(misses) < 24:
                misses.append(f"{template.name} mesh n={n} {fault} m={m} seed={seed}: planted {sorted(expected)} {slow}, named {named} {groups}")
    for line in misses:
        log(f"{NAME}: wrong: {line}")
    total = sum(s.sets for s in scores.values()) + sum(s.sets for s in mesh.values())
    log(f"{NAME}: {total} sets in {time.perf_counter() - t0:.0f}s")
    return _rows(scores, by_size) + _mesh_rows(mesh)


def mesh_cases(sizes: Sequence[int], seeds: int) -> Iterator[tuple[int, str, float, int]]:
    for n in sizes:
        for seed in range(seeds):
            for fault in MESH_FAULTS:
                for m in MESH_MAGNITUDES if fault.startswith("slow_link") else MAGNITUDES:
                    yield n, fault, m, seed


@dataclass
class MeshScore:
    """Counts over mesh sets of one kind: the slow group named, and ranks or groups named wrongly."""

    sets: int = 0
    groups_found: int = 0
    ranks_found: int = 0
    ranks_planted: int = 0
    sets_with_false_group: int = 0
    sets_with_false_rank: int = 0

    def add(self, named: set[int], expected: set[int], groups: list[str], slow: str | None) -> None:
        self.sets += 1
        self.groups_found += slow is not None and slow in groups
        self.ranks_found += len(named & expected)
        self.ranks_planted += len(expected)
        self.sets_with_false_group += any(g != slow for g in groups)
        self.sets_with_false_rank += bool(named - expected)


def _mesh_rows(mesh: dict[str, MeshScore]) -> list[Result]:
    rows: list[Result] = []
    links = [mesh[f] for f in ("slow_link_tp", "slow_link_dp") if f in mesh]
    found, sets = sum(s.groups_found for s in links), sum(s.sets for s in links)
    rows.append(Result(NAME, "mesh: slow link localised to its group (tp and dp)", "sets", found / sets if sets else None, n=sets,
                       target=f">= {RECALL_TARGET:.0%}", met=bool(sets) and found / sets >= RECALL_TARGET,
                       note=f"{found}/{sets} slow groups named; " + ", ".join(f"{f} {mesh[f].groups_found}/{mesh[f].sets}" for f in ("slow_link_tp", "slow_link_dp") if f in mesh)))
    stragglers = [mesh[f] for f in ("forward", "backward") if f in mesh]
    hit, planted = sum(s.ranks_found for s in stragglers), sum(s.ranks_planted for s in stragglers)
    false_in = sum(s.sets_with_false_rank for s in stragglers)
    rows.append(_ratio_row("mesh: recall, one rank slow in forward/backward", hit, planted,
                           note=f"{hit}/{planted} planted ranks named; another rank named in {false_in}/{sum(s.sets for s in stragglers)} sets"))
    every = list(mesh.values())
    false_groups, all_sets = sum(s.sets_with_false_group for s in every), sum(s.sets for s in every)
    rows.append(Result(NAME, "mesh: sets naming a group not planted", "sets", false_groups / all_sets if all_sets else None, n=all_sets,
                       target="0", met=false_groups == 0, note=f"{false_groups}/{all_sets} (healthy, stragglers, slow links)"))
    blameless = [mesh[f] for f in ("healthy", "slow_link_tp", "slow_link_dp") if f in mesh]
    false_ranks, blameless_sets = sum(s.sets_with_false_rank for s in blameless), sum(s.sets for s in blameless)
    rows.append(Result(NAME, "mesh: false-culprit rate: healthy and slow links", "sets", false_ranks / blameless_sets if blameless_sets else None,
                       n=blameless_sets, target="0", met=false_ranks == 0, note=f"{false_ranks}/{blameless_sets} sets named a rank"))
    return rows


def _rows(scores: dict[str, Score], by_size: dict[int, Score]) -> list[Result]:
    rows: list[Result] = []
    total = Score()
    for fault in ONE_RANK_FAULTS:
        s = scores.get(fault, Score())
        for f in ("sets", "found", "missed", "wrong", "sets_with_false_culprit", "right_phase"):
            setattr(total, f, getattr(total, f) + getattr(s, f))
        rows.append(_recall_row(f"recall, planted: {fault}", s))
        rows.append(_ratio_row(f"precision, planted: {fault}", s.found, s.found + s.wrong,
                               note=f"right phase named for {s.right_phase}/{s.found}"))
    rows.append(_recall_row("recall, all planted faults", total, target=True))
    rows.append(_ratio_row("precision, all planted faults", total.found, total.found + total.wrong))
    for n, s in sorted(by_size.items()):
        rows.append(_recall_row(f"recall at {n} ranks", s))
    for fault in (*BLAMELESS, "moving"):
        s, blameless = scores[fault], fault in BLAMELESS
        rows.append(Result(NAME, f"false-culprit rate: {fault}", "sets", s.sets_with_false_culprit / s.sets if s.sets else None,
                           n=s.sets, target="0" if blameless else "", met=s.sets_with_false_culprit == 0 if blameless else None,
                           note=f"{s.sets_with_false_culprit}/{s.sets} sets named a rank ({s.wrong} ranks)"))
    return rows


def _recall_row(metric: str, s: Score, target: bool = False) -> Result:
    value = s.found / (s.found + s.missed) if s.found + s.missed else None
    return Result(NAME, metric, "ranks", value, n=s.sets,
                  target=f">= {RECALL_TARGET:.0%}" if target else "", met=(value is not None and value >= RECALL_TARGET) if target else None,
                  note=f"{s.found}/{s.found + s.missed} planted ranks named")


def _ratio_row(metric: str, num: int, den: int, note: str = "") -> Result:
    return Result(NAME, metric, "ranks", num / den if den else None, n=den, note=note or f"{num}/{den} named ranks were planted")
