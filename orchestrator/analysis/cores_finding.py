"""The ranks' training threads wait for a core longer than they run: their host runs more threads than it has cores.

The trace cannot show it: a preempted forward reads as a longer forward. The agent's clock of the training thread
(:mod:`~orchestrator.analysis.cpu_wait`) can: its time off a CPU while the trace has it working, preempted more often
than it gives its core up. Where one rank waits more than the others it is a straggler (told there); where every
rank waits alike no rank stands out, and before this finding the report said "No findings" of a job whose two ranks
each waited 83-89% of an 800-990 ms step (two processes spinning beside rayprof's example job on two cores; 25 ms a step
without them). Under half the step the wait is a note (:data:`~orchestrator.analysis.cpu_wait.CORES_SHARED_WARNING`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.cpu_wait import cores_fix, count_range, oversubscribed, shared_waits
from orchestrator.analysis.finding_base import make_finding, ranks_text
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = ["cores_shared"]


def cores_shared(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> Finding | None:
    """Where the ranks are oversubscribed (:func:`~orchestrator.analysis.cpu_wait.oversubscribed`: a thread waited
    for a core half its step; a straggler's is left to its own finding): every rank whose thread waits for a core
    (:func:`~orchestrator.analysis.cpu_wait.shared_waits`), bound by their median wait."""
    slow = {s.rank for s in stragglers}
    hit = [(r, seen, f) for r, seen, f in shared_waits(ranks) if r.rank not in slow]
    if not hit or not oversubscribed(hit):
        return None
    shares = [f for _, _, f in hit]
    span = f"{min(shares):.0%}" if len(hit) == 1 else f"{min(shares):.0%}-{max(shares):.0%}"
    times = count_range(seen.involuntary for _, seen, _ in hit)
    gave = count_range(seen.voluntary for _, seen, _ in hit)
    median = statistics.median_low(seen.off_cpu_ms for _, seen, _ in hit)
    anchor = next(r for r, seen, _ in hit if seen.off_cpu_ms == median)
    one = len(hit) == 1
    who = ranks_text([r for r, _, _ in hit])
    return make_finding(
        "cores_shared",
        anchor,
        median,
        title=f"The training thread{'' if one else 's'} of {who} wait{'s' if one else ''} for a CPU {span} of each step",
        evidence=(
            f"The training thread{'' if one else 's'} of {who} {'was' if one else 'were'} off a CPU {span} of each step "
            f"while {'its trace has it' if one else 'their traces have them'} working (the waits the trace names left "
            f"out; {median:.1f} ms of the {anchor.mean_step_ms or 0:.1f} ms step on rank {anchor.rank}), and the "
            f"scheduler took {'its' if one else 'their'} core {times} times a step while {'it' if one else 'they'} gave "
            f"it up {gave} times: other threads or processes ran on {'its' if one else 'their'} cores. Every phase "
            "reads longer than the work it holds by that wait."
        ),
        fix=cores_fix([r for r, _, _ in hit], ranks),
        ranks=[r.rank for r, _, _ in hit],
    )
