"""The straggler finding: a rank that holds the others back (:func:`~orchestrator.analysis.cross.stragglers`), told
by why: busy longer in one phase, starting its steps late, or, in a pipeline, the slowest stage; each with its fix."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.anomaly import alone
from orchestrator.analysis.comm_fix import leading_collective
from orchestrator.analysis.cpu_wait import cores_fix, starved
from orchestrator.analysis.finding_base import make_finding, runtime_of, worst_straggler
from orchestrator.analysis.gc_finding import explains_straggler
from orchestrator.analysis.host_python import own_python
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = ["straggler"]

# Phases whose excess on a pipeline's rank is its stage's own work: the layers it runs and their parameters.
_STAGE_PHASES = frozenset({"forward", "backward", "optimizer"})


def straggler(ranks: Sequence[RankSummary], stragglers: Sequence[Straggler]) -> Finding | None:
    """One or more ranks hold the others back: busier each step, or starting it late."""
    worst = worst_straggler(stragglers)
    if worst is None or explains_straggler(worst, ranks):
        return None  # none, or the garbage collector's pauses, which their own finding tells
    others = [s for s in stragglers if s is not worst]
    by_rank = {r.rank: r for r in ranks}
    fixes = {
        "data": "its input pipeline is slower: check its data shard, storage locality and loader workers",
        "forward": "its forward does more work or runs slower: check uneven input sizes per rank, rank-gated extra work "
        "(logging, eval, checkpoints), and a throttled or shared device on its host",
        # 'other': outside forward, backward and the optimizer; mostly before the step fetches its batch.
        "other": "it does more outside the model: rank-gated work between steps (logging, metrics, evaluation, "
        "checkpoint writes on one rank alone) or a slower host; give every rank the same work between steps or move "
        "it off the critical path (an asynchronous checkpoint, metrics reduced every N steps)",
    }
    if worst.cause == "late_arrival":
        title = f"Rank {worst.rank} starts its steps late; {'the other rank waits' if len(ranks) == 2 else 'the others wait'} for it"
        evidence = (
            f"Rank {worst.rank} starts the step {worst.phase_excess_ms:.1f} ms after the earliest rank and waits only "
            f"{worst.comm_wait_ms:.1f} ms, while the ranks that started on time wait {worst.reference_comm_wait_ms:.1f} ms "
            f"(in collectives or in {runtime_of((by_rank.get(worst.rank) or ranks[0]).device).synchronize} on them)."
        )
        fix = (
            "Look at what that rank does between steps, outside the profiled step: rank-gated work (logging, metrics, "
            "evaluation, checkpoint writes), a slower data fetch before the step marker, or a busier host; give every "
            "rank the same work between steps or move it off the critical path."
        )
    elif worst.phase in _STAGE_PHASES and leading_collective(by_rank.get(worst.rank) or ranks[0]) == "send_recv":
        title = f"Rank {worst.rank}'s pipeline stage is the slowest ({worst.phase})"
        evidence = (
            f"Rank {worst.rank} is busy {worst.excess_ms:.1f} ms ({worst.excess_fraction:.0%} of the step) longer per step "
            f"than the other ranks, {worst.phase_excess_ms:.1f} ms of it in {worst.phase}; sends and receives lead its "
            f"collectives, as a pipeline stage's do. The others wait for it ({worst.reference_comm_wait_ms:.1f} ms/step) "
            f"while it waits {worst.comm_wait_ms:.1f} ms."
        )
        fix = (
            f"Each stage waits for the slowest one once per micro-batch, so the pipeline runs at rank {worst.rank}'s pace: "
            "move layers from its stage to a neighbouring one (the split point: torch.distributed.pipelining's "
            "split_spec or SplitPoint, or the layers each stage's module is built from) until every stage's forward and "
            "backward take the same time; a stage that also holds the embeddings or the loss head takes fewer layers."
        )
    else:
        title = f"Rank {worst.rank} is a straggler ({worst.phase})"
        evidence = (
            f"Rank {worst.rank} is busy {worst.excess_ms:.1f} ms ({worst.excess_fraction:.0%} of the step) longer per step "
            f"than the other ranks, {worst.phase_excess_ms:.1f} ms of it in {worst.phase}. The others wait for it in "
            f"collectives ({worst.reference_comm_wait_ms:.1f} ms/step) while it waits {worst.comm_wait_ms:.1f} ms."
        )
        fix = (
            "Find what differs on that rank: "
            + fixes.get(worst.phase, f"compare its {worst.phase} spans with another rank's in the merged trace")
            + ". Every rank runs at the straggler's speed until it is fixed."
        )
        anomaly = alone(worst.rank, ranks)  # a certain cause: before the guesses from samples and thread time
        own = own_python(worst, ranks, {s.rank for s in stragglers}) if anomaly is None else None
        waited = starved(worst, ranks, {s.rank for s in stragglers}) if own is None and anomaly is None else None
        if anomaly is not None:
            title = f"Rank {worst.rank} is a straggler: it alone runs autograd's anomaly detection"
            evidence += (
                f" It alone checks every gradient for NaN ({anomaly[0]:.0f} checks and at least {anomaly[1]:.1f} ms a step: "
                "anomaly detection's own finding)."
            )
            fix = (
                f"Turn autograd's anomaly detection off on rank {worst.rank} (torch.autograd.set_detect_anomaly(True) "
                "under a rank condition, or a detect_anomaly() context only it enters): every other rank waits for it each "
                "step until then."
            )
        if waited is not None:
            title = f"Rank {worst.rank} is a straggler: its training thread waits for a CPU"
            evidence += (
                f" Its training thread was off a CPU {waited.off_cpu_ms:.1f} ms a step while its trace has it working "
                f"(the waits the trace names left out), against {waited.others_off_cpu_ms:.1f} ms on the other ranks, and "
                f"the scheduler took its core {waited.preemptions:.0f} times a step (theirs: {waited.others_preemptions:.0f}): "
                "the same work as theirs, waiting for a core."
            )
            fix = cores_fix([by_rank[worst.rank]], ranks) + " Every rank runs at the straggler's speed until it is fixed."
        if own is not None:
            extra, where, who = own
            evidence += f" The stack samples put {extra:.1f} ms a step of it in the loop's own Python, which the other ranks do not run: {where}."
            fix = (
                f"{who} runs on rank {worst.rank} alone ({extra:.1f} ms a step) while every other rank waits for it in the "
                "next collective: run it every N steps or on a background thread, or split it over every rank (each its "
                "share, then one reduce). Every rank runs at the straggler's speed until it is fixed."
            )
    if others:
        evidence += " Also holding the others back: " + ", ".join(f"rank {s.rank} ({s.cause.replace('_', ' ')})" for s in others) + "."
    anchor = by_rank.get(worst.rank) or ranks[0]
    return make_finding(
        "straggler", anchor, worst.excess_ms, title=title, evidence=evidence, fix=fix, ranks=[s.rank for s in stragglers]
    )

