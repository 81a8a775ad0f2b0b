"""Findings about the device: it idles, it is the bottleneck, or collectives do not overlap compute."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.accumulation import early_ms
from orchestrator.analysis.advice import Cause, fix_for, named_causes, once_note, paid_once, told_idle_ms
from orchestrator.analysis.anomaly import traceback_ms
from orchestrator.analysis.between import MOSTLY, periodic_text, periodic_work
from orchestrator.analysis.comm_fix import by_collective_text, comm_fix, leading_collective
from orchestrator.analysis.finding_base import (
    DEVICE_NAMES,
    REPORT_FRACTION,
    OneStep,
    claimed_causes,
    comm_cost,
    first_use_examples,
    idle_text,
    make_finding,
    ms_list,
    one_step,
    per_step_cost,
    ranks_text,
    share,
    step_word,
)
from orchestrator.analysis.gc_finding import gc_wait_ms
from orchestrator.analysis.generation import GENERATION_REGION, ROLLOUT_REGION
from orchestrator.analysis.groups import slow_groups
from orchestrator.analysis.idle import PYTHON_OUTSIDE_OPS
from orchestrator.analysis.kernel_kinds import device_work_fix, kinds, short_name
from orchestrator.analysis.own_collectives import own_collectives
from orchestrator.analysis.param_loops import LOOP_REGION
from orchestrator.analysis.spans import is_comm_kernel_name
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = [
    "COMM_EXPOSED_FRACTION",
    "GPU_BOUND_UTILIZATION",
    "HOST_IDLE_FRACTION",
    "LOW_GPU_UTILIZATION",
    "NEGLIGIBLE_FRACTION",
    "comm_exposed",
    "gpu_bound",
    "low_gpu_utilization",
]

# Busy share of the step on the GPU under which it is called underused.
LOW_GPU_UTILIZATION = 0.5
# Busy share of the step from which the job is GPU-bound (where the device computes at least LOW_GPU_UTILIZATION of
# it): only faster kernels help.
GPU_BOUND_UTILIZATION = 0.9
# How many kernels the GPU-bound finding names.
GPU_BOUND_TOP_KERNELS = 5
# Share of the step that even the least-waiting rank waits in collectives.
COMM_EXPOSED_FRACTION = 0.25


# Share of the step under which a named cause is too small to be told a fix.
NEGLIGIBLE_FRACTION = 0.01
# Share of the step the device idles for causes with no finding of their own (host CPU work, launches,
# queued work) from which it is reported even when the device is busy more than LOW_GPU_UTILIZATION.
HOST_IDLE_FRACTION = 0.2
# A named cause is one step's when at most this share of it can lie in the other steps (the idle time its sources
# have there, against the cause's total): no fix is told for it, the step is named instead.
ONE_OFF_ELSEWHERE = 0.1
# When neither a cause nor unnamed time explains a share of the step worth a change.
_SPREAD = (
    "The idle time no other finding claims is spread over small causes, none of them "
    f"{NEGLIGIBLE_FRACTION:.0%} of the step: no change is told for it."
)


def _unnamed_ms(r: RankSummary) -> float:
    """Idle ms per step no cause names: Python outside any op that no frame of the user's code names (a trace without
    stacks names none), and host time nothing profiled; at most the idle time no finding claims (Python inside a told
    loop or generation is that finding's)."""
    assert r.idle is not None
    cpu = r.idle.get("cpu")
    python = sum(o.total_ms for o in cpu.top if o.name == PYTHON_OUTSIDE_OPS) - cpu.python_frames_ms if cpu is not None else 0.0
    return min(max(python, 0.0) / max(len(r.steps), 1) + r.idle.ms("untraced"), _unclaimed(r))


def _unnamed_fix(r: RankSummary, ms: float) -> str:
    """How to find out what the host does while the device idles (``ms`` per step), where no cause names it."""
    cpu = r.idle.get("cpu") if r.idle is not None else None
    stacks = cpu is not None and bool(cpu.python_frames)  # with_stack or the stack samples named what they could
    how = "wrap" if stacks else "profile with with_stack=True or wrap"
    # Where the steps spend that long before fetching their batch, the code runs there: the loop's own between steps.
    between = statistics.mean(s.between_ms for s in r.steps) if r.steps else 0.0
    if between >= MOSTLY * ms:
        return (
            f"The host runs code the profiler does not name while the device idles ({ms:.1f} ms per step), most of it "
            f"before each step fetches its batch ({between:.1f} ms a step after the optimizer step: logging, metrics, "
            f"callbacks): {how} those parts in torch.profiler.record_function to see which."
        )
    return (
        f"The host runs code the profiler does not name while the device idles ({ms:.1f} ms per step): {how} the step's "
        "parts in torch.profiler.record_function to see what the device waits for."
    )


def _one_off(r: RankSummary, cause: Cause) -> OneStep | None:
    """The step that holds nearly all of ``cause`` (at least 1 - ONE_OFF_ELSEWHERE of it), or None.

    The trace gives a named cause's time for the window only, its sources' idle time per step: what the other
    steps hold of the sources bounds what they can hold of the cause."""
    found = one_step(r, per_step := per_step_cost(r, cause.sources))
    if found is None:
        return None
    elsewhere = sum(per_step) - found.ms
    return found if elsewhere <= ONE_OFF_ELSEWHERE * cause.ms * len(per_step) else None


def _names(causes: Sequence[Cause]) -> str:
    return ", ".join(c.name for c in causes[:3])


def _one_off_fix(r: RankSummary, when: OneStep, causes: Sequence[Cause]) -> str:
    return (
        f"What the host does while the device idles here ({_names(causes)}) is {when.label(r)}'s alone: a one-off such as "
        f"warm-up ({first_use_examples(r.device)}), which later steps do not pay. Profile steps after it (a later "
        "window) to judge the steady state."
    )


def _periodic_fix(r: RankSummary, when: OneStep) -> str:
    return (
        f"The device idles {when.ms:.1f} ms in {when.label(r)} while the host works before fetching that step's batch: "
        f"{periodic_text(r, when.step)}"
    )


def _unclaimed(r: RankSummary) -> float:
    """Device idle ms per step not claimed by a finding of its own (DataLoader, syncs, copies, collectives, a loop
    over tensors, generation)."""
    if r.idle is None:
        return 0.0
    claimed = claimed_causes(r)
    told = sum(told_idle_ms(r, region) for region in (LOOP_REGION, GENERATION_REGION, ROLLOUT_REGION)) + traceback_ms(r)
    return max(0.0, sum(c.ms_per_step for c in r.idle.causes if c.cause not in claimed) - told)


def low_gpu_utilization(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The device idles for much of the step: say why, from the idle attribution.

    Reported when the device is busy under ``LOW_GPU_UTILIZATION`` of the step,
    or when the idle time no other finding claims reaches ``HOST_IDLE_FRACTION``.
    Its bound is that unclaimed idle time (host CPU work, launch pace, queued
    work, untraced host time, and causes too small for their own finding), so
    no idle time is counted in two findings, less what the loop pays once (a
    first use, a graph capture or compilation: no change to the loop saves it). The fix is the one for the largest
    named cause (:mod:`orchestrator.analysis.advice`), and the runner-up's when it
    explains at least ``REPORT_FRACTION`` of the step; time no cause names (Python outside any op no frame names,
    untraced time) that outweighs the largest named cause is told first, with how to find out what it is. A warning when that cause
    explains ``WARNING_FRACTION`` of the step, or when the device is busy under
    ``LOW_GPU_UTILIZATION`` and the unclaimed idle time does (a mostly idle device
    is a fact, whatever the spread of its causes).
    """
    hit = [
        r for r in ranks
        if r.gpu is not None and r.idle is not None and r.mean_step_ms
        and (r.gpu.utilization < LOW_GPU_UTILIZATION or share(r, _unclaimed(r)) >= HOST_IDLE_FRACTION)
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda r: (share(r, _unclaimed(r)), -r.gpu.utilization))
    claimed = claimed_causes(worst)
    owned = sorted(claimed) + (["the loop over tensors"] if told_idle_ms(worst, LOOP_REGION) > 0 else []) + (
        ["the generation"] if told_idle_ms(worst, GENERATION_REGION) > 0 else []
    ) + (
        ["the rollout"] if told_idle_ms(worst, ROLLOUT_REGION) > 0 else []
    ) + (
        ["anomaly detection's tracebacks"] if traceback_ms(worst) > 0 else []
    )
    named = named_causes(worst, exclude=claimed)
    # A graph capture or a compilation is told as such even in one step; other causes one step holds are named with it.
    one_offs = {c: found for c in named if c.kind not in ("capture", "compile") and (found := _one_off(worst, c)) is not None}
    # Paid once by the loop (a first use: the CUDA context, a module's first launch; graphs captured or code compiled once):
    # named, never given a loop fix, like a cause one step holds (which says more where the window shows it).
    once = [c for c in named if paid_once(c, worst) and c not in one_offs and share(worst, c.ms) >= NEGLIGIBLE_FRACTION]
    steady = [c for c in named if c not in one_offs and not paid_once(c, worst)]
    # One-offs worth naming: those a fix would have been told for.
    told = [c for c in one_offs if share(worst, c.ms) >= NEGLIGIBLE_FRACTION]
    # A fix is told for a cause that explains a share of the step worth it: the lead from NEGLIGIBLE_FRACTION, the runner-up
    # from REPORT_FRACTION; a fix for a negligible cause would send the user after nothing, and one for a cause one
    # step holds (warm-up) after something no later step pays.
    fixes = [
        fix_for(c, worst, after=steady[0] if i else None) for i, c in enumerate(steady[:2])
        if share(worst, c.ms) >= (NEGLIGIBLE_FRACTION if i == 0 else REPORT_FRACTION)
    ]
    held = ""
    steady_fixes = list(fixes)
    steady_told = bool(fixes)
    if told:
        alike = [c for c in told if one_offs[c].step == one_offs[told[0]].step]
        if fixes:
            verb, pronoun = ("is", "it") if len(alike) == 1 else ("are", "them")
            held = f" {_names(alike)} {verb} {one_offs[told[0]].label(worst)}'s alone: no fix is told for {pronoun}."
        else:
            fixes = [_one_off_fix(worst, one_offs[told[0]], alike)]
    if once:
        # The largest is told first when no steady cause leads it (the steady lead's fix follows as a runner-up would:
        # from REPORT_FRACTION); the rest are only named.
        told_first = not fixes or not steady or once[0].ms > steady[0].ms
        runner_up = fixes[:1] if not steady_told or share(worst, steady[0].ms) >= REPORT_FRACTION else []
        fixes = [fix_for(once[0], worst), *runner_up] if told_first else fixes
        held += "".join(once_note(c) for c in once[1 if told_first else 0:])
    # The idle time this finding counts, step by step: when one step holds most of it, the mean is that step's.
    one_off = one_step(worst, per_step_cost(worst, [c.cause for c in worst.idle.causes if c.cause not in claimed]))
    # Where that step's idle time is what the loop does before fetching its batch, that is what it is, whatever its
    # causes; then time no cause names that outweighs the named lead is told first: a fix for a smaller cause alone
    # would send the user after a part of the story.
    unnamed = _unnamed_ms(worst)
    if one_off is not None and periodic_work(worst, one_off):
        fixes = [_periodic_fix(worst, one_off), *steady_fixes[:1]]
    elif unnamed > (named[0].ms if named else 0.0) and share(worst, unnamed) >= (REPORT_FRACTION if fixes else NEGLIGIBLE_FRACTION):
        fixes = [_unnamed_fix(worst, unnamed), *(fixes[:1] if named and share(worst, named[0].ms) >= REPORT_FRACTION else [])]
    elif not fixes:
        fixes = [_SPREAD]
    mostly_idle = worst.gpu.utilization < LOW_GPU_UTILIZATION
    # What the loop pays once is no saving a change to it can make (a capture-only window would claim 100%).
    once_ms = sum(c.ms for c in once)
    if once_ms > 0:
        held += f" The saving leaves out {_names(once)} ({once_ms:.1f} ms per step): later steps do not pay it."
    return make_finding(
        "low_gpu_utilization",
        worst,
        max(_unclaimed(worst) - once_ms, 0.0),
        title=f"The {DEVICE_NAMES[worst.device]} device is busy {worst.gpu.utilization:.0%} of the {step_word(worst)}",
        evidence=(
            f"Kernels and copies cover {worst.gpu.utilization:.0%} of the {step_word(worst)} on rank {worst.rank} "
            f"({worst.gpu.kernel_ms_per_step:.1f} ms of kernels per {worst.mean_step_ms:.1f} ms); found on {ranks_text(hit)}. "
            + idle_text(worst)
            + (f" Idle time with a finding of its own ({', '.join(owned)}) is counted there, not here." if owned else "")
            + (f" By what the host does: {listed}." if (listed := ms_list(((c.name, c.ms) for c in named), limit=4)) else "")
            + held
        ),
        fix=" ".join(fixes),
        ranks=[r.rank for r in hit],
        cause_ms=max(max((c.weight_ms for c in steady), default=0.0), _unclaimed(worst) - once_ms if mostly_idle else 0.0),
        one_off=one_off,
    )


def gpu_bound(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """The device is busy nearly all the step: only faster device work shortens it; name the kernels.

    A collective kernel no compute kernel overlaps keeps the device busy waiting for its peers: that time is the
    comm finding's, and a device that computes less than half the step is underused, however busy (TraceLens' MI300
    ResNet rank: busy 95% of the step, 66% of the step in collectives nothing overlaps, 29% computing; it was told
    "GPU-bound" beside "communication does not overlap computation")."""
    hit = [
        r for r in ranks if r.gpu is not None and r.mean_step_ms and r.gpu.utilization >= GPU_BOUND_UTILIZATION
        and _computing(r) >= LOW_GPU_UTILIZATION
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda r: r.gpu.utilization)
    per_step = max(len(worst.steps), 1)
    # Collective kernels run beside compute and wait for peers: they are the comm finding's, not a kernel to tune.
    top = [k for k in worst.top_kernels if not is_comm_kernel_name(k.name)][:GPU_BOUND_TOP_KERNELS]
    listed = "; ".join(f"{k.name[:80]} {k.total_ms / per_step:.2f} ms ({share(worst, k.total_ms / per_step):.0%})" for k in top)
    found = kinds(worst)
    by_kind = ", ".join(f"{t.kind} {t.ms:.1f} ms ({share(worst, t.ms):.0%})" for t in found)
    # Kernels on several streams at once (MTIA's, a comm stream's neighbours) add up past the step: say so, or a share
    # over 100% reads as an error.
    summed_ms = sum(t.ms for t in found)
    overlapping = (
        f" Kernels on several streams run at the same time: their times add up to {summed_ms:.1f} ms per "
        f"{worst.mean_step_ms:.1f} ms {step_word(worst)}, so these shares overlap."
        if share(worst, summed_ms) > 1.0
        else ""
    ) + _comm_beside(worst)
    return make_finding(
        "gpu_bound",
        worst,
        min(sum(k.total_ms for k in top) / per_step, worst.gpu.busy_ms_per_step),
        severity="info",
        # An MTIA is no GPU: the title names the accelerator the trace recorded.
        title=(
            f"{'GPU' if worst.device in ('cuda', 'rocm', 'xpu') else DEVICE_NAMES[worst.device]}-bound: the device is busy "
            f"{worst.gpu.utilization:.0%} of the {step_word(worst)}"
        ),
        evidence=(
            f"Device work covers {worst.gpu.utilization:.0%} of the step on rank {worst.rank} (at least "
            f"{GPU_BOUND_UTILIZATION:.0%} on {ranks_text(hit)}): host-side fixes cannot win more than its "
            f"{worst.gpu.idle_ms_per_step:.1f} ms of idle time. Top kernels per step: {listed}. The top kernels by kind: {by_kind}."
            + overlapping
        ),
        fix=device_work_fix(
            found, worst.mean_step_ms or 0.0, REPORT_FRACTION, worst.accelerator, worst.mean_phases.backward > 0, worst.loop,
            worst.device,
        ),
        ranks=[r.rank for r in hit],
    )


def _computing(r: RankSummary) -> float:
    """The share of ``r``'s step its device is busy with anything but collective kernels that no compute overlaps."""
    assert r.gpu is not None and r.mean_step_ms
    return r.gpu.utilization - r.gpu.comm_exposed_ms_per_step / r.mean_step_ms


def _comm_beside(r: RankSummary) -> str:
    """How much collective kernel time a busy rank has and how much of it compute hides: a pipeline that overlaps
    its all-to-all (DeepEP under DualPipe) is busy because of its math, and the reader should not have to guess."""
    if r.gpu is None or r.gpu.comm_overlap is None or share(r, r.gpu.comm_kernel_ms_per_step) < REPORT_FRACTION:
        return ""
    names = ", ".join(list(dict.fromkeys(short_name(k.name) for k in r.top_kernels if is_comm_kernel_name(k.name)))[:3])
    return (
        f" Collective kernels ({names or 'NCCL'}) take {r.gpu.comm_kernel_ms_per_step:.1f} ms a {step_word(r)} beside the compute, "
        f"{r.gpu.comm_overlap:.0%} of it under compute kernels ({r.gpu.comm_exposed_ms_per_step:.1f} ms exposed)."
    )


def comm_exposed(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Collectives do not overlap compute: even the least-waiting rank waits.

    The least-waiting rank is used because the others' wait includes waiting
    for stragglers, which the straggler finding reports instead. Likewise the
    wait a slow link adds (its group's excess over its peers', which every rank
    waits out in lockstep) is the slow_link finding's: no overlap removes it;
    the all-reduces of micro-batches before the last are the accumulation's, and
    the wait for other ranks' garbage collections is the collector's.
    """
    timed = [r for r in ranks if r.mean_step_ms]
    if not timed:
        return None
    slow = slow_groups(ranks)
    link_ms = slow[0].excess_ms if slow else 0.0

    def rest(r: RankSummary) -> float:
        return max(0.0, comm_cost(r) - link_ms - early_ms(r))

    def cost(r: RankSummary) -> float:
        return rest(r) - gc_wait_ms(r, ranks, rest(r))

    least = min(timed, key=lambda r: share(r, cost(r)))
    if share(least, cost(least)) < COMM_EXPOSED_FRACTION:
        return own_collectives(timed)
    overlap = ""
    if least.gpu and least.gpu.comm_overlap is not None:
        overlap = f" Only {least.gpu.comm_overlap:.0%} of collective kernel time overlaps compute kernels."
    if len(timed) == 1:
        # With no other rank to compare, a wait for a slower peer looks the same as an exposed collective.
        overlap += " Only this rank's trace was analysed: part of the wait may be for slower ranks; analyse all ranks to tell."
    if slow:
        overlap += f" Not counted: {link_ms:.1f} ms per step that the slow link in process group {slow[0].name} adds (its own finding)."
    if early_ms(least):
        overlap += f" Not counted: {early_ms(least):.1f} ms per step in gradient reductions of micro-batches before the last (their own finding)."
    if gc_waited := gc_wait_ms(least, ranks, rest(least)):
        overlap += f" Not counted: {gc_waited:.1f} ms per step waiting for other ranks' garbage collections (their own finding)."
    return make_finding(
        "comm_exposed",
        least,
        cost(least),
        title=(
            "Sends and receives do not overlap computation: pipeline stages wait for their neighbours"
            if leading_collective(least) == "send_recv"
            else "Communication does not overlap computation"
        ),
        evidence=(
            f"Even the rank that waits least (rank {least.rank}) loses {cost(least):.1f} ms "
            f"({share(least, cost(least)):.0%}) of its {least.mean_step_ms:.1f} ms step to collectives"
            + (" (collective kernels no compute overlaps, and idle time the host waits in collectives)" if least.idle else "")
            + "; "
            + ", ".join(f"rank {r.rank}: {cost(r):.1f} ms" for r in timed)
            + "."
            + overlap
            + by_collective_text(least)
        ),
        fix=comm_fix(least),
        ranks=[least.rank],
        # The first collective of a window can carry a communicator's set-up (NCCL creates it lazily, seconds).
        one_off=one_step(least, _comm_per_step(least)),
    )


def _comm_per_step(r: RankSummary) -> list[float]:
    """:func:`comm_cost` step by step."""
    if r.gpu is None or r.idle is None:
        return per_step_cost(r, [], "comm")
    return [(s.comm_exposed_ms or 0.0) + s.idle_ms.get("collective", 0.0) for s in r.steps]
