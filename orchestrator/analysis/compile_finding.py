"""torch.compile compiling inside the steps of a trace with no device: a first call's cost, or recompiles.

On a device the compiler's time is the device's idle time, and the idle attribution tells it (its ``compile``
cause, :mod:`orchestrator.analysis.advice`). A CPU-only trace has no device to idle, so the same time read as the
forward and backward it compiles, and nothing said it: the main thread's ``(dynamo_timed)`` regions
(:func:`~orchestrator.analysis.spans.compilations`) per step (``StepBreakdown.compile_ms``) say it here. Compiled in
at most half the steps, it is warm-up (a first call, or the second shape before automatic dynamic shapes take
over); in more, the loop recompiles (a new input shape or a failed guard each time).

Recorded (``tests/data/record_cpu_compile.py``): transformers' Trainer with ``torch_compile=True`` on a two-layer GPT-2,
batches padded to their longest (a new length each step). Dynamo recompiles the second length, then marks the
dimension dynamic and compiles no more; with automatic dynamic shapes off (``torch._dynamo.config.
automatic_dynamic_shapes=False``, as ``torch.compile(dynamic=False)`` does) every step recompiled, 20-23 s against
10-20 ms eager (measured unprofiled, TORCH_LOGS=recompiles), and the report said "No warning".
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.between import lifted
from orchestrator.analysis.finding_base import make_finding, ranks_text, step_word
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = ["RECOMPILE_FIX", "WARM_UP", "compile_in_steps"]

RECOMPILE_FIX = (
    "a new input shape or a failed guard recompiles. Mark the dimension that changes dynamic "
    "(torch._dynamo.mark_dynamic(x, 0), or torch.compile(dynamic=True)), or pad inputs to a few fixed sizes (a data "
    "collator's pad_to_multiple_of); TORCH_LOGS=recompiles says which guard failed."
)
WARM_UP = (
    "(Dynamo traces the model, Inductor generates and autotunes its kernels), not the loop's. Profile steps after it "
    "(a later window) to judge the loop; a warm cache (TORCHINDUCTOR_CACHE_DIR kept between runs) shortens it."
)


def _compiling(r: RankSummary) -> list[int]:
    return [s.step for s in r.steps if s.compile_ms > 0]


def compile_in_steps(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Some rank with no device compiles with torch.compile inside its steps."""
    hit = [r for r in ranks if r.gpu is None and r.steps and r.mean_step_ms and _compiling(r)]
    if not hit:
        return None
    worst = max(hit, key=lambda r: sum(s.compile_ms for s in r.steps))
    steps, word = _compiling(worst), step_word(worst)
    ms = sum(s.compile_ms for s in worst.steps) / len(worst.steps)
    once = 2 * len(steps) <= len(worst.steps)
    which = f"{len(steps)} of the {len(worst.steps)} {word}s ({word}{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})"
    evidence = (
        f"torch.compile's compiler runs in {which} on rank {worst.rank}: {ms:.1f} ms of the {worst.mean_step_ms or 0:.1f} "
        f"ms {word}, mean over the window" + (f" (found on {ranks_text(hit)})" if len(hit) > 1 else "")
        + ". Its time is counted in the forward and backward it compiles above."
    )
    if once:
        return make_finding(
            "compile", worst, 0.0, severity="info", ranks=[r.rank for r in hit],
            title=f"torch.compile compiles in {len(steps)} of the {len(worst.steps)} {word}s: warm-up",
            evidence=evidence + lifted(worst), fix=f"It is a first call's cost {WARM_UP}",
        )
    return make_finding(
        "compile", worst, ms, ranks=[r.rank for r in hit],
        title=f"torch.compile compiles again in {len(steps)} of the {len(worst.steps)} {word}s: "
        f"{ms / (worst.mean_step_ms or ms):.0%} of the {word}",
        evidence=evidence, fix=f"Recompiling is no warm-up: {RECOMPILE_FIX}",
    )
