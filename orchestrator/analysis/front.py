"""The analysis front: a folder of rank traces in, a :class:`Summary` out.

Thin on purpose (the shape of HTA's ``trace_analysis.py``): the loader maps
ranks to files (:mod:`orchestrator.traces.discover`), each rank is analysed on
its own and dropped before the next is loaded (:mod:`orchestrator.analysis.rank`),
and the cross-rank analyses and findings are functions over the per-rank
results (:mod:`orchestrator.analysis.cross`, :mod:`orchestrator.analysis.findings`).
When the traces are merged too, :func:`analyze_for_merge` has the same read of
each rank scan it for the merge (:func:`~orchestrator.traces.merge.merge_traces`'s ``scans``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator.analysis.between import between_note
from orchestrator.analysis.cpu_wait import shared_cores_note
from orchestrator.analysis.cross import StragglerImpl, arrivals, blame_late_ranks, common_steps, step_spread, stragglers
from orchestrator.analysis.findings import find_all
from orchestrator.analysis.groups import held_back, slow_groups
from orchestrator.analysis.profiler_cost import profiler_cost_note
from orchestrator.analysis.rank import analyze_rank
from orchestrator.models.analysis import Finding, RankSummary, Summary
from orchestrator.models.merge_stats import RejectedTrace
from orchestrator.traces.clocks import RankAlignment, align, wall_clock_note
from orchestrator.traces.discover import TraceFile, TraceSet, discover_traces
from orchestrator.traces.fanout import RankMap, serial
from orchestrator.traces.gcpause import gc_paused
from orchestrator.traces.loader import load_rank
from orchestrator.traces.merge_plan import RankScan, RankScanner
from orchestrator.traces.stream import TraceParseError

__all__ = [
    "Finding", "RankSummary", "Summary", "analyze_and_scan", "analyze_file", "analyze_folder", "analyze_for_merge",
    "analyze_traces",
]


def analyze_folder(
    path: Path, *, straggler_impl: StragglerImpl = stragglers, rank_map: RankMap = serial
) -> Summary:
    """Analyse a profile folder (``{profile}/traces/...``), a plain folder of ``*.pt.trace.json[.gz]``, or one trace file.

    Raises ``FileNotFoundError`` when ``path`` is neither a folder nor a file. Unusable files
    are listed in ``Summary.rejected`` with their reason; the other ranks are
    still analysed.
    """
    return analyze_traces(discover_traces(Path(path)), straggler_impl=straggler_impl, rank_map=rank_map)


@gc_paused
def analyze_file(trace_file: TraceFile, _: Any = None) -> RankSummary | RejectedTrace:
    """One rank on its own (the part a fan-out runs where the file is): its summary, or why it was refused."""
    try:
        return analyze_rank(load_rank(trace_file))
    except TraceParseError as exc:
        return RejectedTrace(path=trace_file.path, rank=trace_file.rank, reason=f"unreadable trace: {exc}")


@gc_paused
def analyze_and_scan(trace_file: TraceFile, _: Any = None) -> tuple[RankSummary | RejectedTrace, RankScan | None]:
    """:func:`analyze_file` and the merge's scan of the rank from one read of its file.

    A file that does not read cleanly is left to each on its own (no scan: the
    merge scans it), so a damaged rank is refused and cut short exactly as
    when analysis and merge run apart.
    """
    scanner = RankScanner(trace_file)
    try:
        trace = load_rank(trace_file, on_batch=scanner.add)
    except TraceParseError:
        return analyze_file(trace_file), None
    return analyze_rank(trace), scanner.finish(trace.raw_bytes)


def analyze_traces(
    traces: TraceSet, *, straggler_impl: StragglerImpl = stragglers, rank_map: RankMap = serial
) -> Summary:
    """Analyse already-discovered traces; ``straggler_impl`` swaps the straggler algorithm, ``rank_map``
    runs the per-rank part (:func:`analyze_and_scan`: the scan's collective ends align the ranks' clocks),
    and the cross-rank part joins the small summaries here."""
    return analyze_for_merge(traces, straggler_impl=straggler_impl, rank_map=rank_map)[0]


def analyze_for_merge(
    traces: TraceSet, *, straggler_impl: StragglerImpl = stragglers, rank_map: RankMap = serial
) -> tuple[Summary, dict[int, RankScan]]:
    """:func:`analyze_traces`, and each rank's scan for ``merge_traces(traces, ..., scans=...)``, from one read per
    rank (:func:`analyze_and_scan`); a rank whose file did not read cleanly has no scan."""
    results = list(rank_map(analyze_and_scan, [(tf, None) for tf in traces.files], "analysing"))
    scans = {tf.rank: scan for tf, (_, scan) in zip(traces.files, results) if scan is not None}
    return _join(traces, [summary for summary, _ in results], scans, straggler_impl), scans


def _on_merged_clock(ranks: list[RankSummary], scans: dict[int, RankScan]) -> tuple[list[RankSummary], str | None]:
    """The ranks with their step starts and timed collections moved onto the merged trace's clock (the merge's
    alignment, from the same scans), so that which rank starts late does not depend on how far apart their clocks were;
    and the note on ranks placed by wall clock only."""
    sources = [scans[r.rank] for r in ranks if r.rank in scans]
    if len(sources) < 2:
        return ranks, None
    reference_us = min(s.base_time_ns for s in sources) / 1000
    alignment = {a.rank: a for a in align(sources, min(s.base_time_ns for s in sources))}
    out = []
    for r in ranks:
        a = alignment.get(r.rank)
        if a is not None:
            r = _moved(r, partial(_merged_us, a, scans[r.rank].base_time_ns / 1000, reference_us))
        out.append(r)
    return out, wall_clock_note(list(alignment.values()))


def _merged_us(a: RankAlignment, own_base_us: float, reference_us: float, unix_us: float) -> float:
    """A time of a rank's own clock (unix µs) on the merged trace's."""
    return reference_us + a.merged_us(unix_us - own_base_us)


def _moved(r: RankSummary, clock: Callable[[float], float]) -> RankSummary:
    """``r`` with its step starts and the garbage collections its agent timed (unix µs) on ``clock``."""
    steps = [s.model_copy(update={"start_unix_us": clock(s.start_unix_us)}) for s in r.steps]
    gc = r.gc and r.gc.model_copy(
        update={"collections": [c.model_copy(update={"start_us": round(clock(c.start_us))}) for c in r.gc.collections]}
    )
    return r.model_copy(update={"steps": steps, "gc": gc})


def _join(
    traces: TraceSet, results: list[RankSummary | RejectedTrace], scans: dict[int, RankScan], straggler_impl: StragglerImpl
) -> Summary:
    """The cross-rank part over the per-rank results."""
    ranks: list[RankSummary] = []
    rejected: list[RejectedTrace] = list(traces.rejected)
    for result in results:
        (rejected if isinstance(result, RejectedTrace) else ranks).append(result)  # type: ignore[arg-type]
    issues = list(traces.issues)
    ranks, clock_note = _on_merged_clock(ranks, scans)
    if clock_note is not None:
        issues.append(clock_note)
    issues += [f"rank {r.rank}: {i}" for r in ranks for i in r.issues]
    arr = arrivals(ranks)
    if arr is not None:
        # Time a waiter spends waiting for late arrivers is theirs to fix, not its own syncs'.
        # Its device idles in those waits for the late ranks, not for its own host (idle cause late_rank).
        ranks = [
            blame_late_ranks(r.model_copy(update={"waits_for_others_ms": arr.extra_wait_ms[r.rank]}), arr.extra_wait_ms[r.rank])
            if r.rank in arr.waiting else r
            for r in ranks
        ]
    steps = common_steps(ranks)
    if ranks and all(r.window == "profiler_steps" and len(r.steps) == 1 for r in ranks):
        issues.append(
            f"one step analysed (step {ranks[0].steps[0].step}): a one-off (compilation, warm-up, an epoch's first batch) "
            "reads the same as a cost every step pays; profile more steps (--steps) to tell them apart"
        )
    if (between := between_note(ranks)) is not None:
        issues.append(between)
    if (cores := shared_cores_note(ranks)) is not None:
        issues.append(cores)
    if len({len(r.steps) for r in ranks if r.steps}) > 1:
        issues.append("ranks recorded different steps: " + ", ".join(f"rank {r.rank}: {len(r.steps)}" for r in ranks))
    definitions = Counter(r.step_definition for r in ranks if r.step_definition)
    if len(definitions) > 1:
        issues.append("ranks' steps hold different work: " + "; ".join(f"rank {r.rank}: {r.step_definition}" for r in ranks))
    groups = slow_groups(ranks)
    slow = held_back(straggler_impl(ranks), ranks, groups)
    sizes = {tf.world_size for tf in traces.files if tf.world_size is not None}
    return Summary(
        source=str(traces.folder),
        world_size=sizes.pop() if len(sizes) == 1 else None,
        steps=steps,
        step_definition=definitions.most_common(1)[0][0] if definitions else None,
        loop=loops.most_common(1)[0][0] if (loops := Counter(r.loop for r in ranks if r.loop is not None)) else None,
        ranks=ranks,
        rejected=sorted(rejected, key=lambda r: (r.rank is None, r.rank or 0, r.path.name)),
        caution=profiler_cost_note(ranks),
        issues=issues,
        step_spread=step_spread(ranks),
        stragglers=slow,
        slow_groups=groups,
        findings=find_all(ranks, slow),
    )
