"""The autograd engine's nodes on one thread, and which of them holds a span: what runs inside backward that is not
a derivative formula's own work (anomaly detection's NaN checks, activation checkpointing's recomputed forward)."""

from __future__ import annotations

import bisect

from orchestrator.analysis.spans import Kinds
from orchestrator.traces.loader import Span

__all__ = ["NODE_PREFIX", "Nodes"]

NODE_PREFIX = "autograd::engine::evaluate_function: "


class Nodes:
    """One thread's ``autograd::engine::evaluate_function: ...`` spans, in start order."""

    def __init__(self, kinds: Kinds) -> None:
        self.spans = sorted((s for (name, _), group in kinds.items() if name.startswith(NODE_PREFIX) for s in group), key=lambda s: s.ts)
        self._starts = [s.ts for s in self.spans]
        # The latest end among the nodes up to each: the walk back stops where no earlier node reaches the span.
        self._reach: list[float] = []
        for s in self.spans:
            self._reach.append(max(s.end, self._reach[-1]) if self._reach else s.end)

    def holding(self, span: Span) -> Span | None:
        """The innermost node that holds ``span`` (a reentrant backward's nodes nest), or None."""
        for i in range(bisect.bisect_right(self._starts, span.ts) - 1, -1, -1):
            if self._reach[i] < span.end:
                return None
            if self.spans[i].end >= span.end:
                return self.spans[i]
        return None
