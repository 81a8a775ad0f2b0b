"""The change that cuts an optimizer step's host time, chosen by what the trace shows the step is: which optimizer
classes the trace steps (:attr:`RankSummary.optimizers`) and how they update the parameters
(:attr:`RankSummary.optimizer_impl`). ``fused=True`` is the change for a foreach Adam (torch's default on a GPU),
``foreach=True`` for a per-parameter RMSprop, and neither exists for an optimizer torch.optim does not ship
(Shampoo, an EMA wrapper), where telling ``AdamW(fused=True)`` names no change at all."""

from __future__ import annotations

from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.models.analysis import RankSummary

__all__ = ["optimizer_changes", "optimizer_fix"]

# torch.optim's classes with a fused implementation (fused=True: one kernel launch per parameter group, on CUDA and
# ROCm and, since PyTorch 2.4, on CPU), and those with foreach only (a few multi-tensor ops for all parameters).
_FUSED = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
_FOREACH = frozenset({"Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop"})
_FUSED_ON = frozenset({"cuda", "rocm", "xpu", "cpu"})


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def optimizer_changes(r: RankSummary) -> str | None:
    """The changes for ``r``'s optimizer steps, by their classes (:attr:`RankSummary.optimizers`) and how they update
    the parameters; None where the trace names no optimizer class."""
    classes, impl = r.optimizers, r.optimizer_impl
    if not classes:
        return None
    changes = []
    # Where a framework builds or steps the optimizer from its settings, where fused=True goes there.
    settings: list[Change] = []
    fusable = [c for c in classes if c in _FUSED]
    if fusable and impl != "fused":
        settings.append(Change.FUSED_ADAMW if set(fusable) <= {"Adam", "AdamW"} else Change.FUSED_OPTIMIZER)
        runs = "its foreach ops" if impl == "foreach" else "its ops per parameter"
        changes.append(
            f"pass fused=True to {_listed(fusable)} (torch.optim.{fusable[0]}(params, fused=True)): one kernel launch per "
            f"parameter group in place of {runs}" + ("" if r.device in _FUSED_ON else ", where the device has fused kernels")
        )
    foreach = [c for c in classes if c in _FOREACH]
    if foreach and impl == "per_parameter":
        changes.append(f"pass foreach=True to {_listed(foreach)}: a few multi-tensor ops for all parameters")
    # Apex's, DeepSpeed's and Transformer Engine's FusedAdam / FusedLAMB: fused by their own multi-tensor kernels.
    library_fused = [c for c in classes if c.startswith("Fused")]
    others = [c for c in classes if c not in _FUSED and c not in _FOREACH and c not in library_fused]
    if others:
        changes.append(
            f"{_listed([f'{c}.step' for c in others])} {'is' if len(others) == 1 else 'are'} not torch.optim's, so "
            f"fused=True does not exist for {'it' if len(others) == 1 else 'them'}: torch.compile the step "
            "(torch.compile(optimizer.step)) to fuse its per-parameter ops, or use the library's own fused or foreach "
            "variant where it has one"
        )
    if not changes:
        # Fused already (torch's fused=True, a library's FusedAdam): what is left is the Python around its kernels.
        steps = _listed([f"{c}.step" for c in library_fused]) if library_fused else "the step"
        changes.append(
            f"{steps} {'are' if len(library_fused) > 1 else 'is'} fused already: torch.compile it, or make fewer steps "
            "(gradient accumulation, a larger batch)"
        )
    return f"({_listed(classes)}): " + "; ".join(changes) + "; and zero_grad(set_to_none=True)." + in_loop(r.loop, settings)


def optimizer_fix(r: RankSummary, figure: str) -> str:
    """The fix for ``figure`` of device idle time in ``r``'s optimizer steps."""
    head = f"The optimizer's host time leaves the device idle {figure}"
    changes = optimizer_changes(r)
    if changes is not None:
        return f"{head} {changes}"
    return (
        f"{head}: use a fused or foreach optimizer (e.g. torch.optim.AdamW(params, fused=True), or foreach=True), "
        "which launches a few kernels for all parameters instead of several per parameter, and "
        "zero_grad(set_to_none=True); or torch.compile the optimizer step."
    )
