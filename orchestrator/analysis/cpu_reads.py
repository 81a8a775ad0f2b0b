"""Which reads of a CPU-only trace would be no wait on a GPU either: on a device trace a read counts only where a
sync call or a device-to-host copy lies under it, but on a CPU-only trace every ``aten::item`` is counted, and two
libraries read CPU tensors once per parameter every step."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from orchestrator.analysis.intervals import Intervals, clip, union
from orchestrator.analysis.spans import Kinds, is_data, site_parts, where
from orchestrator.traces.loader import Span

__all__ = ["DDP_BUCKET_COPY", "waits_on_a_device"]

# DDP's reducer copies each parameter's gradient out of its bucket in this record_function.
DDP_BUCKET_COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"

Wait = tuple[float, float, str]  # start, end, the site that read


def waits_on_a_device(waits: list[Wait], optimizer: Intervals, main: Sequence[Span], kinds: Kinds) -> list[Wait]:
    """``waits`` (the main thread's reads, in order) less the reads of CPU tensors:

    * in the optimizer's own time (``optimizer``): torch.optim reading a parameter's step count (Adam, AdamW, fused
      or not), a CPU tensor even on a GPU unless capturable. LBFGS's own reads (syncs on a GPU) go too: its line
      search needs them, and no change to the training loop removes them;
    * right before a ``copy_bucket_to_grad`` with no op between: DDP with ``find_unused_parameters`` (a transformers
      Trainer's default) reading its CPU map of used parameters, once per parameter (28 a step in a live Trainer
      job: "34 waits per step" where 6 were reads of device values);
    * in the DataLoader's fetch: a Dataset's ``__getitem__`` or collate reading the CPU tensors it builds (a
      ``torch.randint(...).item()`` per sample: "32 waits per step" in a Keras fit() on a DataLoader); the batch
      goes to the device after, and a worker process cannot touch the device at all.
    """
    copies = sorted(t0 for t0, _ in where(kinds, lambda s: s.name == DDP_BUCKET_COPY))
    loading = union(where(kinds, is_data))
    starts = [s.ts for s in main]

    def before_bucket_copy(end: float) -> bool:
        i = bisect.bisect_left(copies, end)
        return i < len(copies) and bisect.bisect_left(starts, end) == bisect.bisect_left(starts, copies[i])

    return [
        w for w in waits
        if not clip(optimizer, w[0], w[1]) and not clip(loading, w[0], w[1])
        and not (site_parts(w[2])[1] == "aten::item" and before_bucket_copy(w[1]))
    ]
