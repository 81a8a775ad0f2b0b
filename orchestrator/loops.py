"""Whose training loop a job runs: its own, or a framework's whose settings a fix should name.

A fix in plain PyTorch words (``torch.autocast``, ``no_sync()``, ``fused=True``) names no change a Lightning or a
Hugging Face ``Trainer`` user can make without reading the framework's source: their loop is the framework's, and
it takes the change as a setting (``Trainer(precision='bf16-mixed')``, ``TrainingArguments(bf16=True)``). The
owner is read from the files of the Python frames around an optimizer step, by the agent in the training
process (its optimizer hook's stack, or the training thread's) and by the analysis in a ``with_stack`` trace; the
agent writes what it found into each trace's top-level metadata under :data:`METADATA_KEY`, so the trace says it
wherever it is read. Standard library only: the agent imports it in the training process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from types import FrameType

__all__ = ["METADATA_KEY", "Loop", "loop_of", "loop_of_stack"]

METADATA_KEY = "rayprof_loop"
"""The trace's top-level field the agent writes the loop's owner into (``torch.profiler.profile.add_metadata``)."""

# An optimizer step's hook runs a few dozen frames inside the loop that calls it (19 in a Lightning Trainer's fit,
# measured outside Ray); a walk this long reaches the loop on any real stack and stays bounded on a runaway recursion.
_MAX_FRAMES = 256


class Loop(str, Enum):
    """A framework that owns the training loop. The order is precedence: a transformers ``Trainer`` runs Accelerate
    inside (and DeepSpeed, when configured), as fastai's distributed training does, so their frames show both, and
    the outermost owner's settings are the ones its user writes; a DeepSpeed engine driven by the job's own loop is
    DeepSpeed's."""

    TRANSFORMERS_TRAINER = "transformers_trainer"
    LIGHTNING = "lightning"
    LIGHTNING_FABRIC = "lightning_fabric"
    FASTAI = "fastai"
    COMPOSER = "composer"
    MMENGINE = "mmengine"
    SKORCH = "skorch"
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"
    KERAS = "keras"
    STABLE_BASELINES3 = "stable_baselines3"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Loop.TRANSFORMERS_TRAINER: "transformers' Trainer",
    Loop.LIGHTNING: "Lightning's Trainer",
    Loop.LIGHTNING_FABRIC: "Lightning Fabric",
    Loop.FASTAI: "fastai's Learner",
    Loop.COMPOSER: "Composer's Trainer",
    Loop.MMENGINE: "MMEngine's Runner",
    Loop.SKORCH: "skorch's NeuralNet",
    Loop.ACCELERATE: "Accelerate",
    Loop.DEEPSPEED: "DeepSpeed",
    Loop.KERAS: "Keras's fit()",
    Loop.STABLE_BASELINES3: "stable-baselines3's learn()",
}
# A file of the framework's, by its path below site-packages (or the source tree a package was installed from).
_OWNERS = (
    (Loop.TRANSFORMERS_TRAINER, re.compile(r"(?:^|/)transformers/trainer\.py$")),
    (Loop.LIGHTNING, re.compile(r"(?:^|/)(?:lightning/pytorch|pytorch_lightning)/")),
    (Loop.LIGHTNING_FABRIC, re.compile(r"(?:^|/)(?:lightning/fabric|lightning_fabric)/wrappers\.py$")),
    # fastai's Learner steps its own optimizer (no torch one): read from the training thread's stack, as Keras's.
    (Loop.FASTAI, re.compile(r"(?:^|/)fastai/learner\.py$")),
    (Loop.COMPOSER, re.compile(r"(?:^|/)composer/trainer/trainer\.py$")),
    # OpenMMLab's MMEngine: its Runner's train loops (its FlexibleRunner can drive a DeepSpeed engine inside).
    (Loop.MMENGINE, re.compile(r"(?:^|/)mmengine/runner/loops\.py$")),
    # skorch's NeuralNet (its AcceleratedNet drives an Accelerator inside: skorch's arguments are what its user writes).
    (Loop.SKORCH, re.compile(r"(?:^|/)skorch/net\.py$")),
    (Loop.ACCELERATE, re.compile(r"(?:^|/)accelerate/(?:accelerator|optimizer)\.py$")),
    (Loop.DEEPSPEED, re.compile(r"(?:^|/)deepspeed/runtime/engine\.py$")),
    # Keras 3 on its torch backend steps no torch optimizer: read from the training thread's stack in its fit().
    (Loop.KERAS, re.compile(r"(?:^|/)keras/src/backend/torch/trainer\.py$")),
    # stable-baselines3's learn(): PPO and A2C (on-policy), SAC, TD3 and DQN (off-policy), sb3-contrib's built on them.
    (Loop.STABLE_BASELINES3, re.compile(r"(?:^|/)stable_baselines3/common/(?:on|off)_policy_algorithm\.py$")),
)


def loop_of(files: Iterable[str]) -> Loop | None:
    """The owner of the loop that runs code in ``files`` (frame file names, any order), None for the job's own."""
    found = {loop for file in files for loop, pattern in _OWNERS if pattern.search(file.replace("\\", "/"))}
    return next((loop for loop in Loop if loop in found), None)


def loop_of_stack(frame: FrameType | None) -> Loop | None:
    """The owner of the loop ``frame`` runs in, from the files of it and its callers (a bounded walk)."""
    files = []
    while frame is not None and len(files) < _MAX_FRAMES:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    return loop_of(files)
