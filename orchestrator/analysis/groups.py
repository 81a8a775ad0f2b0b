"""Cross-rank: a slow link, localised to the process group whose collectives are slower than its peers'.

A slow link (a NIC at a lower speed, a cable falling back to another transport,
an NVLink with errors) slows the collectives of every group whose ring or tree
crosses it, and nobody in them is late or busier: in a job with one process
group every rank's all-reduce grows alike and no rank is to blame
(``benchmarks/culprit.py``, ``slow_link``). With several groups of the same
shape (the tensor-parallel groups of each node, the data-parallel groups
across nodes, HSDP's shard and replicate groups) the slow link shows as the one
group whose collectives take longer than its peers' on *every* member.

Each group's collective time on a member (its kernels' time, from the trace's
``Process Group Name`` on each kernel: PyTorch 2.2+) is the wait for the group's
last member plus the transfer. The member that arrives last waits least, so the
least time over the members, per step, is the transfer itself: a straggler makes
its groups' other members wait, but arrives last in them and so does not make
them look slow. That holds only when every member's trace is there, so a group
is judged only then. Peers are groups doing the same work (description, size,
calls and elements per step); a group is slow when its transfer exceeds the
typical peer's (the low median, so a slow group does not raise its own
reference) by the report share of the step and by more than the peers' own
spread (:func:`_noise_bar`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from orchestrator.analysis.cross import common_steps
from orchestrator.analysis.finding_base import REPORT_FRACTION, make_finding
from orchestrator.models.analysis import Finding, ProcessGroupComm, RankSummary, SlowGroup, Straggler

__all__ = ["HELD_TOLERANCE", "SLOW_GROUP_MIN_MS", "SLOW_GROUP_MIN_PEERS", "SLOW_GROUP_MIN_RATIO", "SLOW_GROUP_MIN_SHARE", "SLOW_GROUP_SIGMAS", "held_back", "slow_groups", "slow_link"]

# A group is slow when its transfer exceeds its typical peer's by at least REPORT_FRACTION of the step the others
# would have without it, by this many milliseconds, and by more than its peers' own spread (_noise_bar): with
# SLOW_GROUP_MIN_PEERS peers or more, SLOW_GROUP_SIGMAS robust standard deviations of theirs and at least
# SLOW_GROUP_MIN_SHARE of the reference; with fewer, SLOW_GROUP_MIN_RATIO times the reference.
SLOW_GROUP_MIN_MS = 0.5
SLOW_GROUP_MIN_PEERS = 5
SLOW_GROUP_SIGMAS = 5.0
SLOW_GROUP_MIN_SHARE = 0.1
SLOW_GROUP_MIN_RATIO = 1.25
# A late arriver is held back by a culprit it shares a group with when it loses at most this times that culprit's excess.
HELD_TOLERANCE = 1.25


def slow_groups(ranks: Sequence[RankSummary]) -> list[SlowGroup]:
    """The process groups slower than their peers on every member, slowest first (none without peers)."""
    steps = set(common_steps(ranks))
    timed = [r for r in ranks if r.process_groups and r.window == "profiler_steps"]
    if not steps or len(timed) < 2:
        return []
    members: dict[str, list[RankSummary]] = defaultdict(list)
    shape: dict[str, ProcessGroupComm] = {}
    for r in timed:
        for g in r.process_groups:
            members[g.name].append(r)
            shape.setdefault(g.name, g)
    transfer = {
        name: t for name, rs in members.items() if len(rs) == shape[name].size and (t := _transfer_ms(rs, name, steps)) is not None
    }
    classes: dict[tuple[str, int, float, float], list[str]] = defaultdict(list)
    for name in transfer:
        g = shape[name]
        classes[(g.description, g.size, round(g.calls_per_step, 2), round(g.elements_per_step))].append(name)
    median_step = statistics.median(r.median_step_ms for r in timed if r.median_step_ms is not None)
    out = []
    for names in classes.values():
        if len(names) < 2:
            continue
        values = [transfer[n] for n in names]
        reference = statistics.median_low(values)
        for name in names:
            excess = transfer[name] - reference
            if excess < max(SLOW_GROUP_MIN_MS, REPORT_FRACTION * (median_step - min(excess, median_step / 2)), _noise_bar(values, reference)):
                continue
            rs = sorted(members[name], key=lambda r: r.rank)
            out.append(
                SlowGroup(
                    name=name, description=shape[name].description, ranks=[r.rank for r in rs],
                    hosts=sorted({r.host for r in rs if r.host}), transfer_ms=transfer[name],
                    peer_transfer_ms=reference, peers=len(names), excess_ms=excess,
                )
            )
    return sorted(out, key=lambda g: -g.excess_ms)


def held_back(stragglers: Sequence[Straggler], ranks: Sequence[RankSummary], slow: Sequence[SlowGroup]) -> list[Straggler]:
    """The stragglers less the late arrivers whose lateness another culprit explains.

    With two levels of groups a delay travels: a rank slow in backward holds its data-parallel group's all-reduce,
    so that whole group starts the next step late and the other groups wait for it in their tensor-parallel
    collectives; a slow link does the same to its group's members. Those members arrive late, and are not to
    blame: a late arriver that shares a process group with a busy straggler, or is a member of a slow group, and
    loses no more than ``HELD_TOLERANCE`` times that culprit's excess, is left out. Traces without process groups
    (CPU-only, PyTorch before 2.2) keep every straggler.
    """
    groups_of = {r.rank: {g.name for g in r.process_groups} for r in ranks}
    busy = [s for s in stragglers if s.cause == "busy"]

    def explained(s: Straggler) -> bool:
        mine = groups_of.get(s.rank, set())
        by_straggler = any(mine & groups_of.get(b.rank, set()) and s.excess_ms <= HELD_TOLERANCE * b.excess_ms for b in busy)
        return by_straggler or any(g.name in mine and s.excess_ms <= HELD_TOLERANCE * g.excess_ms for g in slow)

    return [s for s in stragglers if s.cause != "late_arrival" or not explained(s)]


def _noise_bar(values: Sequence[float], reference: float) -> float:
    """How far over the typical peer a group's transfer must be to stand out of its peers' own spread.

    With ``SLOW_GROUP_MIN_PEERS`` peers or more, ``SLOW_GROUP_SIGMAS`` robust standard deviations of the peers'
    transfers (1.4826 x their median absolute deviation, which one slow group does not move), at least
    ``SLOW_GROUP_MIN_SHARE`` of the reference; with fewer there is no spread to measure, and the bar is
    ``SLOW_GROUP_MIN_RATIO`` - 1 of the reference.
    """
    if len(values) < SLOW_GROUP_MIN_PEERS:
        return (SLOW_GROUP_MIN_RATIO - 1) * reference
    mad = statistics.median(abs(v - statistics.median(values)) for v in values)
    return max(SLOW_GROUP_MIN_SHARE * reference, SLOW_GROUP_SIGMAS * 1.4826 * mad)


def _transfer_ms(members: Sequence[RankSummary], name: str, steps: set[int]) -> float | None:
    """Median over the common steps of the least collective time in group ``name`` over its members."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for r in members:
        for s in r.steps:
            if s.step in steps:
                per_step[s.step].append(s.group_comm_ms.get(name, 0.0))
    least = [min(v) for v in per_step.values() if len(v) == len(members)]
    return statistics.median(least) if least else None


def slow_link(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """A process group's collectives are slower than its peers' on every member: a slow link inside it (groups.py)."""
    found = slow_groups(ranks)
    if not found:
        return None
    worst = found[0]
    by_rank = {r.rank: r for r in ranks}
    label = f"process group {worst.name}" + (f" ({worst.description})" if worst.description else "")
    where = f" on {', '.join(worst.hosts)}" if worst.hosts else ""
    evidence = (
        f"The collectives of {label}, ranks {_span(worst.ranks)}{where}, take {worst.transfer_ms:.1f} ms per step even on "
        f"the member that waits least, against {worst.peer_transfer_ms:.1f} ms in the typical one of its {worst.peers - 1} "
        "peer group(s) doing the same work (size, calls and elements per step): the transfer itself is slower, no rank is late."
    )
    if len(found) > 1:
        evidence += " Also slower than their peers: " + ", ".join(f"group {g.name} (ranks {_span(g.ranks)})" for g in found[1:]) + "."
    return make_finding(
        "slow_link", by_rank[worst.ranks[0]], worst.excess_ms,
        title=f"A slow link in {label}: its collectives take {worst.transfer_ms / worst.peer_transfer_ms:.1f}x its peers'",
        evidence=evidence,
        fix=(
            "Test the links among exactly these ranks: nccl-tests' all_reduce_perf on their GPUs and hosts; NCCL_DEBUG=INFO "
            "for a fallback transport (NET/Socket instead of IB, SHM instead of P2P/NVLink); a NIC at a lower speed "
            "(ibstat, ethtool); NVLink or PCIe errors (nvidia-smi nvlink -e, dmesg). Move the job off that host or link "
            "until it is repaired: every rank runs at this group's pace."
        ),
        ranks=worst.ranks,
    )


def _span(ranks: Sequence[int]) -> str:
    """``8-15`` for consecutive ranks, else the list."""
    ordered = sorted(ranks)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))
