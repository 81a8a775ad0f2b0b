"""The main thread's time in collectives (rule 3 of :mod:`orchestrator.analysis.rank`): the calls, and the waits
inside gloo's work records.

A collective call (``c10d::allreduce_``, ``nccl:all_reduce``, FSDP2's regions) holds the host for as long as it
lasts. gloo's record of the work itself (``gloo:send``, ``gloo:all_reduce``) does not: it opens on the thread that
issues the work and closes when the work completes, so an asynchronous one lasts across the host's next ops.
torch.distributed.pipelining sends each micro-batch's activations so, and computes the next micro-batch while
they travel (a GPipe stage on gloo: 10 ms of its 11 ms of forward inside its own sends' records). The host waits
only where it runs no op of its own inside the record (its ``work.wait()`` is not profiled): that time is
communication, the ops are their own phases.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from orchestrator.analysis.intervals import Intervals, cover, subtract, union
from orchestrator.analysis.spans import Kinds, is_comm, where
from orchestrator.traces.loader import Span

__all__ = ["comm_time"]

_OWN_OPS = frozenset({"cpu_op", "user_annotation"})


def _is_work_record(span: Span) -> bool:
    """gloo's record of one collective's work, from its issue to its completion."""
    return span.name.startswith("gloo:")


def comm_time(main: Sequence[Span], kinds: Kinds) -> Intervals:
    """The main thread's collective calls, and in each of gloo's work records on it the time in which no op of its
    own that began inside the record runs. ``main``: the thread's spans in start order; ``kinds``: them grouped."""
    calls = list(where(kinds, lambda s: is_comm(s) and not _is_work_record(s)))
    starts = [s.ts for s in main]
    waits: Intervals = []
    for spans in kinds.values():
        if not _is_work_record(spans[0]):
            continue
        for record in spans:
            inside = main[bisect.bisect_right(starts, record.ts) : bisect.bisect_left(starts, record.end)]
            own = cover(s for s in inside if s.cat in _OWN_OPS and not is_comm(s))
            waits.extend(subtract([(record.ts, record.end)], own))
    return union(calls + waits)
