"""The change for Python the training thread runs outside any op, by what its largest function does (by whole words
of its name and file): the data's preparation belongs in DataLoader workers, the step's bookkeeping every N steps, a
wait for a Ray call's result a step ahead, a line of the loop itself (a sleep, I/O, a C call) off the step, the rest
off the step or in tensor ops. One text for the device idle it leaves (:mod:`orchestrator.analysis.advice`)
and for the host time it takes on a CPU-only job (:mod:`orchestrator.analysis.host_python`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from orchestrator.analysis.data_fix import PIPELINE_WORKERS, in_pipeline, prep_clause
from orchestrator.analysis.python_frames import frame_parts

__all__ = ["PythonKind", "python_fix", "python_kind"]

PythonKind = Literal["data_prep", "bookkeeping", "ray_call", "loop_line", "python"]

# Whole words of a name (``_preprocess_image``, ``trainer_callback.py``), not parts of others (``compute_logits``, ``thread_pool``).
_DATA_PREP = re.compile(
    r"(?<![a-z])(preprocess\w*|transforms?|normali[sz]e|resize|rescale|crop|decode|read_\w+|load_image|augment\w*|tokeni[sz]\w*|"
    r"collate\w*|image_processing\w*|feature_extraction\w*|pad)(?![a-z])",
    re.IGNORECASE,
)
# Ray's own Python (ray.get, ray.wait, an actor call, a Ray queue): Ray Data's iterator and Ray Train's report() are
# told on their own (orchestrator.analysis.untraced) and never reach here.
_RAY = re.compile(r"^ray/")
_BOOKKEEPING = re.compile(
    r"(?<![a-z])(log|logger|logging|metrics?|callbacks?|print|tqdm|wandb|mlflow|tensorboard|report|save\w*|checkpoint\w*)(?![a-z])",
    re.IGNORECASE,
)


def python_kind(frame: str) -> PythonKind:
    """What a Python function is, by its file (Ray's) or whole words of its frame's name and file."""
    parts = frame_parts(frame)
    if parts is not None and _RAY.match(parts[0]):
        return "ray_call"
    return "data_prep" if _DATA_PREP.search(frame) else "bookkeeping" if _BOOKKEEPING.search(frame) else "python"


def python_fix(kind: PythonKind, frames: Sequence[str], told: str, device: str, idles: bool) -> str:
    """The fix for Python of ``kind`` (its ``frames``, largest first), after ``told`` (what runs, and its figure), on
    a rank of ``device`` (cuda, xpu, cpu...); ``idles``: the job computes on a device, which idles meanwhile."""
    computes = "the device computes" if idles else "the step computes"
    if kind == "data_prep" and in_pipeline(frames):
        return f"{told}: a transformers pipeline's preprocessing, in the step's own process: {PIPELINE_WORKERS}." + prep_clause(
            frames, pipeline=True, device=device
        )
    if kind == "data_prep":
        return (
            f"{told}: the data's preparation, in the step's own process: do it per sample in the Dataset's __getitem__ "
            f"so DataLoader workers (num_workers > 0) prepare the next batches while {computes}, or once, offline, "
            "into a preprocessed dataset." + prep_clause(frames, pipeline=False, device=device)
        )
    if kind == "ray_call":
        return (
            f"{told}: the step waits for a Ray call's result (ray.get on a task's or an actor's result, ray.wait, a Ray "
            "queue): submit it a step ahead and get the previous call's result, so it runs while the step computes; "
            "batch several calls into one, or call every N steps."
        )
    if kind == "loop_line":
        return (
            f"{told}: a line of the loop itself, running no torch op: what it calls there (a sleep, a file or network "
            "call, a C extension) or computes inline is the cost; take it off the step (every N steps, a background "
            "thread), or where it computes, do it as tensor ops over the whole batch."
        )
    if kind == "bookkeeping":
        return (
            f"{told}: the step's bookkeeping (logging, metrics, callbacks, saving), every step: do it every N steps, "
            "on values kept on the device, or on a background thread."
        )
    if idles:
        return (
            f"{told}: move that work off the step (a background thread, a DataLoader worker, every N steps) or onto the "
            "device as tensor ops (torch.compile then fuses them)."
        )
    return (
        f"{told}: do it as tensor ops over the whole batch (one op where a Python loop visits elements one by one), or "
        "move it off the step (a DataLoader worker where it prepares inputs, a background thread, every N steps)."
    )
