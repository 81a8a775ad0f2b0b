"""Gradient accumulation that reduces the gradients every micro-batch.

DDP all-reduces the gradients during each backward pass unless the pass runs under ``no_sync()``; a loop that
accumulates N micro-batches without it sends the gradients N times a step where once would do, the first N-1 times
as partial sums the next micro-batch adds to. The same loop under ``no_sync()`` trains to the same weights. Two gloo
ranks accumulating four micro-batches took 82 ms a step, and 52 ms under ``no_sync()``; told before only as
"communication does not overlap computation", with bucket sizes first. FSDP reduce-scatters likewise unless told
not to (FSDP2's ``set_requires_gradient_sync(False)``), at the cost of unsharded gradients in memory; its parameter
gathers happen for every micro-batch either way, so only its reductions count (:func:`_reduction_share`).

Counted per step in the trace (:class:`orchestrator.analysis.phases.Reductions`): the backward passes, those that
start a reduction, and the early ones (another reducing pass follows before any optimizer step). A GAN's two
models, each stepped after its own backward, and a closure optimizer's passes inside its step are not early. A
framework's accumulation (Lightning's ``accumulate_grad_batches``, the transformers Trainer's
``gradient_accumulation_steps``, Accelerate's ``accumulate``) skips the early syncs itself, and is not told.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

from orchestrator.analysis.comm_fix import collective_ms
from orchestrator.analysis.finding_base import REPORT_FRACTION, comm_cost, make_finding, ranks_text, share, step_word
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.loops import Loop
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = ["Rounds", "accumulation_fix", "accumulation_sync", "early_ms", "early_rounds"]


class Rounds(NamedTuple):
    """A rank's typical step: its backward passes, those that reduce the gradients, and the early ones among them."""

    passes: int
    reducing: int
    early: int


def early_rounds(r: RankSummary) -> Rounds | None:
    """The rank's typical step where most of its steps reduce the gradients before their last micro-batch (else None)."""
    counted = [s.backward for s in r.steps if s.backward is not None]
    if not counted or 2 * sum(b.early > 0 for b in counted) <= len(counted):
        return None
    return Rounds(*(int(statistics.median_low(getattr(b, f) for b in counted)) for f in Rounds._fields))


def early_ms(r: RankSummary) -> float:
    """The rank's collective cost per step that its early rounds carry: its gradient reductions' share of it
    (:func:`~orchestrator.analysis.finding_base.comm_cost`: the exposed part), each round sending the same gradients."""
    rounds = early_rounds(r)
    return comm_cost(r) * _reduction_share(r) * rounds.early / rounds.reducing if rounds else 0.0


def _fsdp(r: RankSummary) -> bool:
    """FSDP's own collective regions ran (FSDP2), or reduce-scatters where DDP did not (FSDP1)."""
    return any(op.name.startswith("FSDP::") for op in r.comm_ops) or (not r.ddp and "reduce_scatter" in collective_ms(r))


def _reduction_share(r: RankSummary) -> float:
    """The share of the rank's collective cost that reduces gradients: FSDP gathers its parameters for every
    micro-batch too, and no accumulation setting removes that. By collective where the device's kernels say
    (all-reduce and reduce-scatter against the rest), by FSDP2's regions on a CPU (its reduce against its gathers);
    else all of it, less the job's own collectives outside forward and backward."""
    cost = comm_cost(r)
    if cost <= 0:
        return 0.0
    by_collective = r.gpu.comm_exposed_by_collective if r.gpu is not None else {}
    if by_collective and sum(by_collective.values()) > 0:
        return sum(ms for kind, ms in by_collective.items() if kind in ("all_reduce", "reduce_scatter")) / sum(by_collective.values())
    fsdp = [op for op in r.comm_ops if op.name.startswith("FSDP::")]
    if fsdp:
        return sum(op.total_ms for op in fsdp if op.name.startswith("FSDP::post_backward")) / sum(op.total_ms for op in fsdp)
    own = r.own_comm.total_ms if r.own_comm is not None else 0.0
    return max(0.0, cost - own) / cost


def accumulation_sync(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Most steps reduce the gradients of a micro-batch that another one then adds to, and those rounds cost
    REPORT_FRACTION of the step or more, on the rank that loses least to them (the others' waits may include
    waiting for slower ranks, which the straggler finding tells)."""
    hit = [r for r in ranks if r.steps and early_rounds(r) is not None]
    if not hit:
        return None
    least = min(hit, key=lambda r: share(r, early_ms(r)))
    cost = early_ms(least)
    rounds = early_rounds(least)
    if rounds is None or share(least, cost) < REPORT_FRACTION:
        return None
    who, verb = ("FSDP", "reduce-scatter") if not least.ddp and _fsdp(least) else ("DDP" if least.ddp else "The job", "all-reduce")
    step = step_word(least)
    return make_finding(
        "accumulation_sync",
        least,
        cost,
        title=f"{who} {verb}s the gradients after every micro-batch: {rounds.reducing} rounds a {step} where one would do",
        evidence=(
            f"Each {step} on rank {least.rank} runs {rounds.passes} backward passes before its optimizer step, and "
            f"{rounds.reducing} of them {verb} the gradients during backward: {rounds.early} of those "
            "rounds send partial sums that the next micro-batch adds to before any optimizer step reads them. The rank "
            f"loses {comm_cost(least):.1f} ms a {step} to collectives, about {cost:.1f} ms of it in the early rounds. "
            f"Found on {ranks_text(hit)}."
        ),
        fix=accumulation_fix(least, rounds) + in_loop(least.loop, [Change.ACCUMULATE]),
        ranks=[r.rank for r in hit],
    )


def accumulation_fix(r: RankSummary, rounds: Rounds) -> str:
    """The change that reduces the gradients once per step, for the rank's early ``rounds`` (by who reduces them)."""
    if not r.ddp and _fsdp(r):
        return (
            f"Skip the reduction in the first {rounds.passes - 1} micro-batches: FSDP2's "
            "model.set_requires_gradient_sync(False) before their backward and True before the last one's (FSDP1: "
            "their forward and backward under model.no_sync()). The gradients then stay unsharded between "
            "micro-batches, a whole copy of the model's gradients on every rank: only where memory allows; otherwise "
            "fewer, larger micro-batches reduce less often."
        )
    if r.zero_stage == 2:
        # No miscount: a DeepSpeed engine reduces every micro-batch's gradients at stage 2 by design, whoever runs it.
        return (
            f"ZeRO stage 2 reduces the gradients of each of the {rounds.passes} micro-batches: each rank keeps only its "
            "partition of them, so it cannot add them up locally. Stage 1 reduces once per accumulated step where a "
            "whole copy of the gradients fits on every rank; otherwise fewer, larger micro-batches reduce less often."
        )
    if r.loop is Loop.DEEPSPEED:
        # Its engine reduces in every backward it takes for the last of an accumulation (ZeRO-2's hooks during it).
        return (
            f"DeepSpeed's engine takes each of the {rounds.passes} backward passes for the end of an accumulation and "
            "reduces the gradients in it: tell it how many micro-batches make a step, and call engine.step() after "
            "every backward (it steps the optimizer on the last one only)."
        )
    if r.ddp:
        return (
            f"Run the forward and backward of the first {rounds.passes - 1} micro-batches under DDP's no_sync() (with "
            "model.no_sync(): loss = ...; loss.backward()) and the last one without it: DDP keeps the gradients local "
            "until the last backward, then all-reduces their sum once, and the update is the same."
        )
    return (
        "The all-reduces start from hooks on the gradients during backward (Horovod's DistributedOptimizer, a gradient "
        f"hook of the job's own): skip them in all but the last of the {rounds.passes} micro-batches (Horovod: "
        f"DistributedOptimizer(..., backward_passes_per_step={rounds.passes})), or wrap the model in DDP and accumulate "
        "under its no_sync()."
    )
