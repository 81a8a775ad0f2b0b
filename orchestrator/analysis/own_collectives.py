"""The job's own collectives weighed as any named cause: a metric or a logged value reduced across the ranks every
step, a barrier (:attr:`RankSummary.own_comm`).

The communication finding waits for a quarter of the step, since part of DDP's or FSDP's collectives is the price of
the gradients' exchange, which overlap only hides. The job's own collectives are no such price: removing them, or
reducing once every N steps, wins all their time. Where communication as a whole stays under that bar, they are told
from REPORT_FRACTION of the step on the rank that spends least in them (the others' time may be waiting for it), a
warning from WARNING_FRACTION, as every other cause is (a Lightning job logging four values with
``self.log(..., sync_dist=True)``: a barrier and an all-reduce each, every step).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.comm_fix import own_fix, surely_own
from orchestrator.analysis.finding_base import REPORT_FRACTION, make_finding, share
from orchestrator.models.analysis import Finding, RankSummary

__all__ = ["own_collectives"]


def own_collectives(timed: Sequence[RankSummary]) -> Finding | None:
    """The finding on the job's own collectives of ``timed`` (ranks with a step time), where every one of them makes
    them, they cannot be its gradients' reduction (:func:`surely_own`: a DeepSpeed engine's, a hand-written loop's
    all-reduce after backward is left to the communication finding's bar) and they reach REPORT_FRACTION of the step
    on the rank that spends least in them; else None."""
    owned = [(r, r.own_comm) for r in timed if r.own_comm is not None and r.own_comm.total_ms > 0 and surely_own(r)]
    if not owned or len(owned) < len(timed):
        return None
    least, own = min(owned, key=lambda pair: share(pair[0], pair[1].total_ms))
    fix = own_fix(least)
    if share(least, own.total_ms) < REPORT_FRACTION or fix is None:
        return None
    per_step = own.calls / max(len(least.steps), 1)
    return make_finding(
        "comm_exposed",
        least,
        own.total_ms,
        title=f"The job's own collectives take {share(least, own.total_ms):.0%} of the step",
        evidence=(
            f"Even the rank that spends least in them (rank {least.rank}) loses {own.total_ms:.1f} ms of its "
            f"{least.mean_step_ms or 0:.1f} ms step to {per_step:.0f} collective calls a step that are neither DDP's nor "
            f"FSDP's ({own.name}); "
            + ", ".join(f"rank {r.rank}: {o.total_ms:.1f} ms" for r, o in owned)
            + f". All collectives take {least.comm_wait_ms:.1f} ms of its step."
        ),
        fix=fix,
        ranks=[r.rank for r, _ in owned],
    )
