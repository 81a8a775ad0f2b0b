"""How one step's forward passes are stated, by the agent (module hooks) and by the trace (forward spans) alike.

``4 forward passes (Discriminator ×3, Generator ×1)``: the most common count per step, by module, modules
by count then name; one module: ``1 forward pass (Net)``. torch.nn's loss modules (``*Loss``) are left out
on both sides: a loss's forward is part of the step, not a pass of the model; so are MMEngine's data preprocessors
(``*DataPreprocessor``), which its ``train_step`` calls on each batch before the model to move it to the device and
normalise it (recorded: ``tests/data/record_cpu_mmengine.py``). One home for the wording, so
that the agent's statement and the trace's read alike and :func:`stated` reads the count back from either.
Standard library only: the agent imports it in the training process.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

__all__ = ["UNNAMED", "not_a_pass", "phrase", "stated", "typical"]

UNNAMED = "forward"
"""The module of a forward that names none (a ``## forward ##`` annotation): counted, not named."""

# torch.nn's losses (MSELoss, BCEWithLogitsLoss_0 as the tracer names it); MMEngine's BaseDataPreprocessor and the
# OpenMMLab libraries' own (mmpretrain's ClsDataPreprocessor, mmdet's DetDataPreprocessor, mmseg's SegDataPreProcessor).
_NOT_A_PASS = re.compile(r"(?:Loss|DataPre[pP]rocessor)(_\d+)?$")
_STATED = re.compile(r"(?:^|; )(\d+) forward pass")


def not_a_pass(module: str) -> bool:
    """A loss module or a batch's preprocessor (a class, or a traced instance such as ``MSELoss_0``): not a forward
    pass of the model."""
    return _NOT_A_PASS.search(module) is not None


def typical(counts: list[Counter[str]]) -> Counter[str]:
    """The most common per-step count; on a tie one that holds something (a step cut short holds less), then
    the later one (the first often sets things up, or was seen only in part)."""
    keyed = [tuple(sorted(c.items())) for c in counts]
    tally = Counter(keyed)
    return counts[max(range(len(keyed)), key=lambda i: (tally[keyed[i]], bool(keyed[i]), i))]


def phrase(by_module: Mapping[str, int]) -> str:
    """``4 forward passes (Discriminator ×3, Generator ×1)``; ``1 forward pass (Net)``; ``2 forward passes``."""
    passes = sum(by_module.values())
    if len(by_module) > 1:
        ranked = sorted(by_module.items(), key=lambda kv: (-kv[1], kv[0]))
        detail = " (" + ", ".join(f"{module} ×{n}" for module, n in ranked) + ")"
    else:
        detail = "" if UNNAMED in by_module or not by_module else f" ({next(iter(by_module))})"
    return f"{passes} forward pass{'' if passes == 1 else 'es'}{detail}"


def stated(definition: str) -> int | None:
    """The forward passes a step statement (``1 step = …; 4 forward passes (…)``) counts, or None if it says none."""
    found = _STATED.search(definition)
    return int(found.group(1)) if found else None
