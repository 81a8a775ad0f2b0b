"""A straggler whose training thread waits for a core: the same work as the other ranks', run slower because the
scheduler keeps taking its CPU away (more ranks, DataLoader workers, intra-op threads or other jobs on its host than
it has cores).

Its trace cannot tell: a preempted forward reads as a longer forward, as one given more data would. The agent times
the training thread over the window (:class:`~orchestrator.models.thread_time.ThreadTime`): its time off a CPU,
less the waits the trace names (data, collectives, syncs, copies), is time the trace has it working while it was not
running; involuntary context switches say the scheduler took the core. The rayprof demo's two ranks on a two-core
machine beside Ray's own processes: told before "Rank 0 is a straggler (forward): check uneven input sizes".
Where every rank waits for cores alike (no straggler), a note says so: their phases then read longer than their work;
from half the step it is a finding of its own (:mod:`~orchestrator.analysis.cores_finding`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from orchestrator.analysis.trace_metadata import read_metadata
from orchestrator.models.analysis import RankSummary, Straggler
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY, ThreadTime

__all__ = [
    "CORES_SHARED_WARNING", "SHARED_CORES_FRACTION", "Starved", "Waiting", "core_wait_ms", "cores_fix", "count_range", "read_thread_time",
    "oversubscribed", "shared_cores_note", "shared_waits", "starved", "waiting",
]

# Share of a step a rank's thread spends off a CPU while working, preempted more than it yields, from which the
# analysis notes that its cores are shared: every phase then reads longer than its work. The two pinned ranks on
# cores of their own (cpu_ddp_own_cores) lose 5% to their own gloo and sampler threads; the demo's, beside Ray's
# processes on two cores, 15-17%.
SHARED_CORES_FRACTION = 0.1
# ... and from which that wait is a finding of its own (cores_finding): the threads wait for a core as long as they
# run. Below it a note: a small node's own processes (Ray's raylet, GCS and agents, the Serve replicas) share its cores
# with every job, the 2-core CI machine's healthy two-rank job waits 11-36% of its step (75 windows, quiet or beside
# bursty processes), and no change to the job's code takes that back; one process spinning beside it: 48-53%, two:
# 86-90% (the step 25 -> 800 ms).
CORES_SHARED_WARNING = 0.5


class Starved(NamedTuple):
    """What the straggler's thread lost to waiting for a core, per step, against the other ranks (their median)."""

    off_cpu_ms: float
    others_off_cpu_ms: float
    preemptions: float
    others_preemptions: float


class Waiting(NamedTuple):
    """One rank's thread per step: off a CPU while working (ms), preempted, and gave up its core (counts)."""

    off_cpu_ms: float
    involuntary: float
    voluntary: float


def read_thread_time(header: Mapping[str, Any]) -> tuple[ThreadTime | None, str | None]:
    """A trace's thread time (None where the agent wrote none), and why it was not read where it is malformed."""
    return read_metadata(header, THREAD_TIME_METADATA_KEY, ThreadTime, "thread time")


def waiting(r: RankSummary) -> Waiting | None:
    """Per step, the time the training thread was off a CPU less the waits its trace names (and Ray Train's report(),
    which its stack samples name), and its context switches (None: no thread time, or no switches counted)."""
    t = r.thread_time
    if t is None or t.involuntary_switches is None or t.voluntary_switches is None or not r.steps:
        return None
    p, n = r.mean_phases, len(r.steps)
    named = p.data + p.comm + p.sync + p.memcpy + sum(s.report_ms for s in r.steps) / n
    off = max(0.0, (t.wall_s - t.cpu_s) * 1000 / n - named)
    return Waiting(off, t.involuntary_switches / n, t.voluntary_switches / n)


def starved(worst: Straggler, ranks: Sequence[RankSummary], slow: set[int]) -> Starved | None:
    """Where a busy straggler's extra time is its thread waiting for a core: off a CPU while working at least half
    its excess longer than the other ranks' (their median; ``slow``: the stragglers, left out), and preempted more
    often than they are by more than it gives its core up more often (a sleep, I/O, a lock or the GIL give it up:
    the thread waits for something else than a core). None where the agent timed no thread."""
    r = next((x for x in ranks if x.rank == worst.rank), None)
    if worst.cause != "busy" or r is None or (mine := waiting(r)) is None:
        return None
    others = [seen for x in ranks if x.rank not in slow and (seen := waiting(x)) is not None]
    if not others:
        return None
    off, involuntary, voluntary = (statistics.median(getattr(o, f) for o in others) for f in Waiting._fields)
    more_preempted = mine.involuntary - involuntary
    if mine.off_cpu_ms - off < worst.excess_ms / 2 or more_preempted <= max(0.0, mine.voluntary - voluntary):
        return None
    return Starved(mine.off_cpu_ms, off, mine.involuntary, involuntary)


def core_wait_ms(ranks: Sequence[RankSummary]) -> float:
    """What a rank's training thread typically waits for a core per step while its trace has it working: the median
    over the ranks whose agent timed their thread, counting a rank's wait where it was preempted more often than it
    gave its core up (else it waits for something else than a core), 0 where none was timed.

    The scheduler hands that wait to whichever rank it holds back, a different one from step to step, so a step's
    slowest rank can be slower by as much with the same work as the others."""
    seen = [x for r in ranks if (x := waiting(r)) is not None]
    if not seen:
        return 0.0
    return statistics.median(x.off_cpu_ms if x.involuntary > x.voluntary else 0.0 for x in seen)


def count_range(counts: Iterable[float]) -> str:
    """``12`` or ``12-15``: counts a step, rounded."""
    seen = sorted(round(c) for c in counts)
    return f"{seen[0]}" if seen[0] == seen[-1] else f"{seen[0]}-{seen[-1]}"


def shared_waits(ranks: Sequence[RankSummary]) -> list[tuple[RankSummary, Waiting, float]]:
    """The ranks whose training threads spent SHARED_CORES_FRACTION of their steps or more off a CPU while working,
    preempted more often than they yielded, with what they saw and that share of the step."""
    return [
        (r, seen, seen.off_cpu_ms / r.mean_step_ms) for r in ranks
        if (seen := waiting(r)) is not None and r.mean_step_ms
        and seen.off_cpu_ms >= SHARED_CORES_FRACTION * r.mean_step_ms and seen.involuntary > seen.voluntary
    ]


def oversubscribed(hit: Sequence[tuple[RankSummary, Waiting, float]]) -> bool:
    """Whether a rank of ``hit`` (:func:`shared_waits`) waited for a core CORES_SHARED_WARNING of its step beside what
    its stack samples put in the loop's own Python and in work before its batch: where a loop sleeps, reads files or
    waits on a socket of its own, its thread is off a CPU without waiting for a core, and its count of switches cannot
    tell one long sleep from many preemptions. Nor in torch.compile's compiler: it waits for the C++ builds of its
    own worker processes, which take the cores (a compiling step read 62-66% off a CPU, its fix no other job's)."""
    return any(
        seen.off_cpu_ms - sum(s.python_ms + s.between_ms + s.compile_ms for s in r.steps) / len(r.steps)
        >= CORES_SHARED_WARNING * step_ms
        for r, seen, _ in hit if (step_ms := r.mean_step_ms or 0.0) > 0
    )


def shared_cores_note(ranks: Sequence[RankSummary]) -> str | None:
    """A note where ranks' training threads wait for a core (:func:`shared_waits`): their timings hold those waits.
    None where none did, or where they are oversubscribed: a finding (or a straggler's) tells it then."""
    hit = shared_waits(ranks)
    if not hit or oversubscribed(hit):
        return None
    shares = [f for _, _, f in hit]
    span = f"{min(shares):.0%}" if len(hit) == 1 else f"{min(shares):.0%}-{max(shares):.0%}"
    times = count_range(seen.involuntary for _, seen, _ in hit)
    one = len(hit) == 1
    who = f"rank {hit[0][0].rank}'s training thread was" if one else (
        "the training threads of ranks " + ", ".join(str(r.rank) for r, _, _ in hit) + " were")
    return (
        f"{who} off a CPU {span} of each step while {'its trace has it' if one else 'their traces have them'} working, "
        f"preempted {times} times a step: {'its' if one else 'their'} cores are shared with other threads or "
        "processes, and every phase above reads longer than the work it holds (cores of its own for each rank take "
        "that back: Ray's resources_per_worker, torch.set_num_threads)"
    )


def cores_fix(hit: Sequence[RankSummary], ranks: Sequence[RankSummary]) -> str:
    """Give the ranks in ``hit`` cores of their own, with what their agents saw of their hosts."""
    t = hit[0].thread_time
    assert t is not None  # waiting() read it
    names = {r.rank for r in hit}
    hosts = sorted({r.host for r in hit if r.host})
    beside = sorted(x.rank for x in ranks if x.host is not None and x.host in hosts and x.rank not in names)
    seen = [f"{t.usable_cores} usable core{'' if t.usable_cores == 1 else 's'}" if t.usable_cores else None,
            f"{t.intra_op_threads} intra-op thread{'' if t.intra_op_threads == 1 else 's'} a rank"]
    shared = f", beside rank{'s' if len(beside) > 1 else ''} {', '.join(map(str, beside))}" if beside else ""
    one = len(hit) == 1
    whose = f"Rank {hit[0].rank}'s host" if one else "The hosts of ranks " + ", ".join(str(r.rank) for r in hit)
    where = f" ({', '.join(hosts)})" if hosts else ""
    return (
        f"{whose}{where} {'runs' if one else 'run'} more threads than {'it has' if one else 'they have'} cores{shared} "
        f"({'; '.join(x for x in seen if x)}). Give every rank cores of its own: reserve them in Ray "
        "(ScalingConfig(resources_per_worker={'CPU': N}), so no more ranks and tasks land on a host than it has cores "
        "for), set torch.set_num_threads (OMP_NUM_THREADS) to the cores each rank has, keep DataLoader workers within "
        "the cores left, and move other jobs off the host."
    )
