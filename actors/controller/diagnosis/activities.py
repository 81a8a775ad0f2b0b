"""What a training thread is doing, in words, from the frames of code rayprof knows (pure functions).

A run turns STALLED when no rank advances for a minute, and a rank that waits on the others looks the same as one
that evaluates for ten: the step count stands still in both. Its stacks tell them apart, but the innermost frame of
an evaluation is some ``linear`` in torch and the job's own innermost frame is the line that called
``trainer.train()``; neither says "evaluating". The frames between them do: ``Trainer.evaluation_loop``,
Lightning's ``evaluation_loop.py``, ``torch.serialization.save``, Dynamo's ``convert_frame``. So each group of
ranks is told the activities its frames hold, outermost first ("evaluating › saving a checkpoint", Lightning's
ModelCheckpoint saving after validation), with the frame where the innermost one begins.

Waiting on other ranks is the innermost frames' to say: a rank blocked in a collective, a barrier or a store is
in torch.distributed's Python when it enters the call that blocks. A torch.distributed frame further out says
nothing of the kind: FSDP's wrapper ``forward`` is on the stack of all the compute it wraps, and
torch.distributed.checkpoint writes its files from its own frames. Nor does DTensor's dispatch as the innermost
frame: a tensor-parallel layer's local matmul runs from there (half the samples of a CPU TP job's training
thread). Ray Train v2's own synchronisation waits too: ``ray.train.report`` (it agrees on the checkpoint folder
with every rank, checkpoint or not) and ``ray.train.collective``, where nothing but the installed ``ray``
package's frames lie inside it (its ``ray.get``; a path merely holding ``/ray/`` is not Ray's: Ray's images keep
the job and every package under ``/home/ray``). Train v1's report waits for no other rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from orchestrator.models.diagnosis import Frame

__all__ = ["activity", "waiting"]

_DISTRIBUTED = "torch/distributed/"
# torch.distributed's own work that is no wait on other ranks: checkpoint file I/O, and a DTensor op computing on
# its local shard (its collectives run in funcol's or c10d's frames further in).
_NOT_A_WAIT = ("torch/distributed/checkpoint/filesystem.py", "torch/distributed/tensor/")

EVALUATING = "evaluating"
SAVING = "saving a checkpoint"
LOADING = "loading a checkpoint"
COMPILING = "compiling with torch.compile"
FETCHING = "fetching a batch from a DataLoader"
REPORTING = "in ray.train.report, which waits for every rank"
RAY_COLLECTIVE = "in a ray.train.collective call, which waits for every rank"
# The installed ray package, wherever Python keeps packages.
_RAY = ("site-packages/ray/", "dist-packages/ray/")


@dataclass(frozen=True)
class _Rule:
    activity: str
    path: str
    """A fragment of the frame's file path, from the package on."""
    functions: frozenset[str] = frozenset()
    """The functions of that file that mean it; empty: any."""

    def holds(self, frame: Frame) -> bool:
        return self.path in _path(frame) and (not self.functions or frame.function in self.functions)


def _rule(activity: str, path: str, *functions: str) -> _Rule:
    return _Rule(activity, path, frozenset(functions))


# Read from the frames of each library's own code (tests/unit/test_stack_activities.py takes them from real runs).
_RULES = (
    _rule(EVALUATING, "transformers/trainer.py", "evaluate", "evaluation_loop", "prediction_loop", "predict"),
    _rule(EVALUATING, "lightning/pytorch/loops/evaluation_loop.py"),
    _rule(EVALUATING, "pytorch_lightning/loops/evaluation_loop.py"),
    _rule(SAVING, "transformers/trainer.py", "_save_checkpoint", "save_model"),
    _rule(SAVING, "lightning/pytorch/trainer/trainer.py", "save_checkpoint"),
    _rule(SAVING, "pytorch_lightning/trainer/trainer.py", "save_checkpoint"),
    _rule(SAVING, "torch/serialization.py", "save"),
    _rule(SAVING, "torch/distributed/checkpoint/state_dict_saver.py", "save", "async_save"),
    _rule(SAVING, "safetensors/torch.py", "save_file", "save_model"),
    _rule(LOADING, "torch/serialization.py", "load"),
    _rule(LOADING, "torch/distributed/checkpoint/state_dict_loader.py", "load"),
    _rule(LOADING, "safetensors/torch.py", "load_file", "load_model"),
    _rule(COMPILING, "torch/_dynamo/convert_frame.py"),
    _rule(COMPILING, "torch/_inductor/compile_fx.py"),
    _rule(FETCHING, "torch/utils/data/dataloader.py", "__next__"),
    _rule(REPORTING, "ray/train/v2/_internal/execution/context.py", "_sync_checkpoint_dir_name_across_ranks"),
    _rule(RAY_COLLECTIVE, "ray/train/v2/_internal/execution/collective_impl.py", "barrier", "broadcast_from_rank_zero"),
)
_RAY_SYNCS = tuple(r for r in _RULES if r.activity in (REPORTING, RAY_COLLECTIVE))


def waiting(frames: Sequence[Frame]) -> bool:
    """Whether the thread waits on other ranks: its innermost frame is torch.distributed's (not its file I/O), or
    it is in Ray Train's synchronisation with only Ray's frames inside."""
    if not frames:
        return False
    inner = _path(frames[-1])
    if _DISTRIBUTED in inner and not any(p in inner for p in _NOT_A_WAIT):
        return True
    for frame in reversed(frames):
        if not any(p in _path(frame) for p in _RAY):
            return False
        if any(r.holds(frame) for r in _RAY_SYNCS):
            return True
    return False


def _path(frame: Frame) -> str:
    return frame.filename.replace("\\", "/")


def activity(frames: Sequence[Frame]) -> str | None:
    """The activities ``frames`` (outermost first) hold, outermost first, and where the innermost begins
    ("evaluating › fetching a batch from a DataLoader (dataloader.py:725 in __next__)"); None where no known code
    says."""
    found: list[tuple[str, Frame]] = []
    for frame in frames:
        rule = next((r for r in _RULES if r.holds(frame)), None)
        if rule is not None and not any(rule.activity == seen for seen, _ in found):
            found.append((rule.activity, frame))
    if not found:
        return None
    begins = found[-1][1]
    return " › ".join(a for a, _ in found) + f" ({PurePath(begins.filename).name}:{begins.line} in {begins.function})"
