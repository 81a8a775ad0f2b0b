"""Python's garbage collector stops the training thread: a ``gc.collect()`` in the loop, or the collector's own full
collections walking a large heap, told from the collections the agent timed
(:class:`~orchestrator.models.gc_pauses.GcPauses`).

No trace shows a collection: its pause lands inside whatever op or line allocated when the collector ran, and reads
as a longer "other", a slower rank, or exposed communication where the other ranks wait for it in the next
collective. Two gloo ranks calling ``gc.collect()`` after every step beside a corpus kept as Python dicts spent
207 ms of a 235 ms step in it, and were told "No findings"; the collector's own full collections (~250 ms each, in
different steps on the two ranks) were told "Communication does not overlap computation".

A step's cost is the process's collections that start in it, on any thread (a DataLoader's pin-memory thread, say):
a collection holds the GIL, so the training thread runs no Python meanwhile. Across ranks, a step costs the longest
of the ranks' (the others wait for it at the next collective, and ranks that collect in the same step pay once).
On a device trace a step's cost is at most its idle time: a pause while the device runs queued work costs nothing. Nor
does one while torch.compile compiles or records CUDA graphs: the compiler makes and drops objects by the million, its
collections are part of its warm-up, and the idle time they fall in is already told as that warm-up's (an H200 saw a
567 ms full collection inside Inductor's code generation).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.analysis.finding_base import REPORT_FRACTION, make_finding, one_step, ranks_text, share, step_word
from orchestrator.analysis.python_frames import frame_label
from orchestrator.analysis.trace_metadata import read_metadata
from orchestrator.models.analysis import Finding, RankSummary, Straggler
from orchestrator.models.gc_pauses import GC_METADATA_KEY, GcCollection, GcPauses
from orchestrator.models.idle import IdleCause

__all__ = [
    "SUMMARY_COLLECTIONS", "explains_imbalance", "explains_straggler", "gc_pause", "gc_wait_ms", "pauses_per_step", "read_gc",
]

FULL = 2  # the oldest generation: a collection of it walks every object the collector tracks
WARM_UP: frozenset[IdleCause] = frozenset({"compile", "capture"})  # idle causes whose collections are theirs


# Collections a rank's summary keeps, the longest (a trace holds up to GC_RECORDS_MAX): the pauses that cost the
# steps, in a summary that the manifest holds for every rank.
SUMMARY_COLLECTIONS = 64


def read_gc(header: Mapping[str, Any]) -> tuple[GcPauses | None, str | None]:
    """A trace's garbage collections (None where the agent timed none; the SUMMARY_COLLECTIONS longest, in time order),
    and why they were not read where malformed."""
    seen, why = read_metadata(header, GC_METADATA_KEY, GcPauses, "garbage collections")
    if seen is None or len(seen.collections) <= SUMMARY_COLLECTIONS:
        return seen, why
    longest = sorted(seen.collections, key=lambda c: c.pause_ms, reverse=True)[:SUMMARY_COLLECTIONS]
    return seen.model_copy(update={"collections": sorted(longest, key=lambda c: c.start_us), "truncated": True}), why


def _in_steps(r: RankSummary) -> list[list[GcCollection]]:
    """The recorded collections (any thread's) that start in each of ``r``'s steps."""
    out: list[list[GcCollection]] = [[] for _ in r.steps]
    if r.gc is None:
        return out
    for c in r.gc.collections:
        for i, s in enumerate(r.steps):
            if s.start_unix_us <= c.start_us < s.start_unix_us + 1000 * s.duration_ms:
                out[i].append(c)
                break
    return out


def pauses_per_step(r: RankSummary) -> list[float]:
    """What the collections cost each of ``r``'s steps, ms: their pauses (:attr:`GcCollection.pause_ms`), at most the
    step's device idle time on a device, less its warm-up's (WARM_UP)."""
    cost = [sum(c.pause_ms for c in found) for found in _in_steps(r)]
    if r.idle is None:
        return cost
    return [min(ms, sum(v for k, v in s.idle_ms.items() if k not in WARM_UP)) for ms, s in zip(cost, r.steps)]


def explains_straggler(worst: Straggler, ranks: Sequence[RankSummary]) -> bool:
    """Whether the straggler's own collections account for half its excess or more: the straggling is the collector's,
    told by :func:`gc_pause` (the ranks pause in turn, each holding the others back)."""
    r = next((x for x in ranks if x.rank == worst.rank), None)
    if r is None or r.gc is None or not r.steps:
        return False
    return statistics.fmean(pauses_per_step(r)) >= worst.excess_ms / 2 and _job_cost(ranks)[1] is not None


def explains_imbalance(lost_ms: float, ranks: Sequence[RankSummary]) -> bool:
    """Whether the job's pauses (each step's longest, :func:`_job_cost`) account for half or more of what the ranks
    lose a step waiting for each step's slowest rank (``lost_ms``): a rank that collects is that step's slowest, a
    different one each step where the ranks collect apart; :func:`gc_pause` tells it."""
    cost, anchor = _job_cost(ranks)
    return anchor is not None and statistics.fmean(cost) >= lost_ms / 2


def gc_wait_ms(r: RankSummary, ranks: Sequence[RankSummary], wait_ms: float) -> float:
    """Of ``r``'s collective wait per step (``wait_ms``), what it waits for other ranks' longer pauses: the job's
    pauses (:func:`_job_cost`) beyond its own, over the window (a pause delays the others at the next collective,
    which may fall in the step after). 0 where the pauses are under REPORT_FRACTION: no finding tells them."""
    cost, anchor = _job_cost(ranks)
    if anchor is None or r.gc is None or not r.steps:
        return 0.0
    return min(wait_ms, max(0.0, statistics.fmean(cost) - statistics.fmean(pauses_per_step(r))))


def _job_cost(ranks: Sequence[RankSummary]) -> tuple[list[float], RankSummary | None]:
    """Per step of the rank that collects most, the longest pause any rank had in that step (by step number); and
    that rank (None: no rank's collections reach REPORT_FRACTION of its step)."""
    timed = [r for r in ranks if r.gc is not None and r.steps]
    if not timed:
        return [], None
    per_rank = {r.rank: dict(zip((s.step for s in r.steps), pauses_per_step(r))) for r in timed}
    anchor = max(timed, key=lambda r: sum(per_rank[r.rank].values()))
    cost = [max(per_rank[r.rank].get(s.step, 0.0) for r in timed) for s in anchor.steps]
    return cost, (anchor if share(anchor, statistics.fmean(cost)) >= REPORT_FRACTION else None)


def gc_pause(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Collections cost REPORT_FRACTION of the step or more."""
    cost, anchor = _job_cost(ranks)
    if anchor is None:
        return None
    timed = [r for r in ranks if r.gc is not None and any(pauses_per_step(r))]
    found = {r.rank: _in_steps(r) for r in timed}
    every = [c for r in timed for step in found[r.rank] for c in step]
    explicit = [c for c in every if c.explicit]
    bound = statistics.fmean(cost)
    hit_steps = sum(ms > 0 for ms in cost)
    where = f"in {hit_steps} of {len(cost)} {step_word(anchor)}s" if hit_steps < len(cost) else f"every {step_word(anchor)}"
    longest = max(c.pause_ms for c in every)
    if sum(c.pause_ms for c in explicit) >= sum(c.pause_ms for c in every) / 2:
        callers = sorted({frame_label(c.caller) for c in explicit if c.caller})
        title = f"The loop calls gc.collect() {where}, up to {longest:.0f} ms each"
        evidence = (
            f"{' and '.join(callers) or 'Code'} calls gc.collect() {where} on {ranks_text(timed)}: "
            f"{_span(explicit)} each, {_generations(explicit)}, timed through the collector's callbacks."
        )
        fix = (
            "Take gc.collect() out of the step: Python collects reference cycles by itself, and a tensor's memory "
            "goes back to the allocator when its last reference goes, with no collection. If memory grows without it, "
            "find what holds the references (a list of losses kept with their graphs: keep loss.item() or "
            "loss.detach()). Where it must stay, call it every few hundred steps at the same step on every rank, and "
            "call gc.freeze() once the model, optimizer and data are built: those objects then leave every "
            "collection's walk."
        )
    else:
        full = {s.step for r in timed for s, step in zip(r.steps, found[r.rank]) if any(c.generation == FULL for c in step)}
        title = f"Python's garbage collector stops the training thread for up to {longest:.0f} ms" + (
            f" (full collections in {len(full)} of {len(cost)} {step_word(anchor)}s)" if full else f", {where}"
        )
        evidence = (
            f"The collector's own collections on {ranks_text(timed)}, timed through its callbacks: {_per_rank(timed, found)}. "
            "A full collection starts once the objects that survived since the last one reach a quarter of those the "
            "collector holds, and walks all of them: a process that holds many objects (a corpus kept as Python dicts, "
            "a large model's modules) pauses long, and a loop that keeps objects across steps (records kept for an "
            "epoch's end, a history list) brings the pauses on."
        )
        fix = _automatic_fix(timed, found)
    elsewhere = [c for c in every if not c.training_thread]
    if elsewhere:
        evidence += (
            f" {len(elsewhere)} of them ran on other threads of the process ({sum(c.pause_ms for c in elsewhere):.0f} ms), "
            "holding the GIL the training thread needs."
        )
    return make_finding(
        "gc_pause", anchor, bound, title=title, evidence=evidence, fix=fix, ranks=[r.rank for r in timed],
        one_off=one_step(anchor, cost),
    )


def _span(collections: Sequence[GcCollection]) -> str:
    low, high = min(c.pause_ms for c in collections), max(c.pause_ms for c in collections)
    return f"{high:.0f} ms" if round(low) == round(high) else f"{low:.0f}-{high:.0f} ms"


def _generations(collections: Sequence[GcCollection]) -> str:
    full = sum(c.generation == FULL for c in collections)
    young = len(collections) - full
    parts = [f"{full} full collection{'' if full == 1 else 's'}" if full else "", f"{young} of younger generations" if young else ""]
    return " and ".join(p for p in parts if p)


def _per_rank(timed: Sequence[RankSummary], found: Mapping[int, list[list[GcCollection]]]) -> str:
    """'full collections: rank 0 in steps 2, 6 (243, 196 ms), rank 1 in step 4 (251 ms); collections of younger
    generations of 0.5 ms or longer: 51, 0.9 ms on average': where the full ones fell, and what the younger ones are."""
    full, young = [], []
    for r in timed:
        hits = [(s.step, sum(c.pause_ms for c in step if c.generation == FULL)) for s, step in zip(r.steps, found[r.rank])]
        hits = [(n, ms) for n, ms in hits if ms]
        young += [c for step in found[r.rank] for c in step if c.generation != FULL]
        if hits:
            word = step_word(r) + ("s" if len(hits) > 1 else "")
            full.append(f"rank {r.rank} in {word} {', '.join(str(n) for n, _ in hits)} ({', '.join(f'{ms:.0f}' for _, ms in hits)} ms)")
    parts = [f"full collections: {', '.join(full)}" if full else "no full collection"]
    if young:
        shortest = min(r.gc.min_recorded_ms for r in timed if r.gc is not None)
        parts.append(
            f"collections of younger generations of {shortest:g} ms or longer: {len(young)}, "
            f"{statistics.fmean(c.pause_ms for c in young):.1f} ms on average"
        )
    return "; ".join(parts)


def _automatic_fix(timed: Sequence[RankSummary], found: Mapping[int, list[list[GcCollection]]]) -> str:
    frozen = max((r.gc.frozen for r in timed if r.gc is not None), default=0)
    steps_of = [{s.step for s, step in zip(r.steps, found[r.rank]) if any(c.generation == FULL for c in step)} for r in timed]
    apart = len(timed) > 1 and len(set.union(*steps_of)) > max(len(s) for s in steps_of)
    parts = [
        f"gc.freeze() already keeps {frozen:,} objects out of the walk: what the collections walk now is what the loop "
        "keeps across steps, so keep less (a running sum or a tensor instead of a Python object per sample or step)."
        if frozen else
        "Call gc.freeze() once the model, optimizer and data are built: the objects that exist then leave every later "
        "collection's walk. Keep fewer objects across steps (a running sum or a tensor instead of a Python object per "
        "sample or step)."
    ]
    if apart:
        parts.append(
            "The ranks collect in different steps, and each pause holds every rank back at the next collective: collect "
            "at the same step on every rank instead, gc.disable() after set-up and gc.collect(1) every N steps in the "
            "loop (what Megatron-LM's --manual-gc and torchtitan's training.gc_freq do)."
        )
    return " ".join(parts)
