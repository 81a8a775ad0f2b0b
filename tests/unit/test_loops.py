"""Whose training loop a job runs, as the agent reads it from the stack and writes it into the trace."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from actors.agent.capture import Capture
from actors.agent.runtime import Agent
from actors.agent.step_cycle import StepCycle
from orchestrator.loops import METADATA_KEY, Loop, loop_of
from tests.support.tracefiles import load_trace
from tests.unit.test_capture import INFO, _train, _window

SITE = "/usr/lib/python3.11/site-packages/"
TRAINER = ["transformers/trainer.py", "accelerate/optimizer.py", "torch/optim/optimizer.py"]
LIGHTNING = ["lightning/pytorch/loops/optimization/automatic.py", "lightning/pytorch/core/optimizer.py", "torch/optim/adam.py"]
OWN = ["train.py", "torch/optim/optimizer.py", "transformers/models/gpt2/modeling_gpt2.py", "ray/train/_internal/utils.py"]


def test_a_transformers_trainer_owns_its_loop_though_accelerate_steps_its_optimizer():
    assert loop_of(SITE + f for f in TRAINER) is Loop.TRANSFORMERS_TRAINER


def test_a_lightning_trainer_owns_its_loop_under_either_package_name():
    assert loop_of(LIGHTNING) is Loop.LIGHTNING
    assert loop_of(["pytorch_lightning/loops/fit_loop.py"]) is Loop.LIGHTNING


def test_accelerate_owns_a_loop_only_through_its_optimizer_or_accelerator():
    assert loop_of(["train.py", SITE + "accelerate/optimizer.py"]) is Loop.ACCELERATE
    assert loop_of(["train.py", SITE + "accelerate/utils/operations.py"]) is None


def test_a_deepspeed_engine_stepped_by_the_jobs_own_loop_is_deepspeeds():
    engine = ["train.py", SITE + "deepspeed/runtime/engine.py", "torch/optim/optimizer.py"]
    assert loop_of(engine) is Loop.DEEPSPEED
    # A Trainer configured with DeepSpeed: its settings (TrainingArguments) are the ones its user writes.
    assert loop_of(engine + [SITE + "transformers/trainer.py"]) is Loop.TRANSFORMERS_TRAINER


def test_keras_owns_the_loop_its_fit_runs_on_the_torch_backend():
    fit = ["train.py", SITE + "keras/src/backend/torch/trainer.py", SITE + "keras/src/utils/traceback_utils.py"]
    assert loop_of(fit) is Loop.KERAS
    assert loop_of(["train.py", SITE + "keras/src/layers/core/dense.py"]) is None  # its layers in the job's own loop


def test_fastais_learner_owns_its_loop_and_its_accelerate_inside():
    fit = ["train.py", SITE + "fastai/learner.py", SITE + "fastai/callback/core.py", SITE + "torch/_tensor.py"]
    assert loop_of(fit) is Loop.FASTAI
    # fastai's distributed training drives an Accelerator: fastai's callbacks are the settings its user writes.
    assert loop_of(fit + [SITE + "accelerate/accelerator.py"]) is Loop.FASTAI
    assert loop_of(["train.py", SITE + "fastai/optimizer.py"]) is None  # its optimizer in the job's own loop


def test_composers_trainer_owns_its_loop_and_its_models_are_not_a_loop():
    fit = ["train.py", SITE + "composer/trainer/trainer.py", SITE + "composer/core/engine.py", "torch/optim/optimizer.py"]
    assert loop_of(fit) is Loop.COMPOSER
    assert loop_of(["train.py", SITE + "composer/models/tasks/classification.py"]) is None  # its model in the job's own loop


def test_mmengines_runner_owns_its_loop_and_a_deepspeed_engine_inside():
    fit = ["train.py", SITE + "mmengine/runner/runner.py", SITE + "mmengine/runner/loops.py",
           SITE + "mmengine/optim/optimizer/optimizer_wrapper.py", "torch/optim/optimizer.py"]
    assert loop_of(fit) is Loop.MMENGINE
    # Its FlexibleRunner's DeepSpeedStrategy: the config's optim_wrapper and strategy are what its user writes.
    assert loop_of(fit + [SITE + "deepspeed/runtime/engine.py"]) is Loop.MMENGINE


def test_skorchs_neuralnet_owns_its_loop_and_the_accelerator_its_mixin_drives():
    fit = ["train.py", SITE + "skorch/classifier.py", SITE + "skorch/net.py", "torch/optim/optimizer.py"]
    assert loop_of(fit) is Loop.SKORCH
    assert loop_of(fit + [SITE + "accelerate/optimizer.py"]) is Loop.SKORCH  # skorch.hf's AccelerateMixin


def test_a_loop_of_the_jobs_own_is_nobodys_even_with_a_transformers_model():
    assert loop_of(OWN) is None


_FILES = st.lists(st.sampled_from(OWN + ["accelerate/optimizer.py", *TRAINER, *LIGHTNING, "C:\\envs\\x\\lightning\\pytorch\\trainer\\trainer.py"]))


@given(_FILES, st.randoms())
def test_the_owner_does_not_depend_on_the_order_of_the_frames(files, random):
    shuffled = list(files)
    random.shuffle(shuffled)
    assert loop_of(shuffled) == loop_of(files)


@given(_FILES)
def test_frames_of_the_jobs_own_code_never_change_the_owner(files):
    assert loop_of(files + OWN) == loop_of(files)


def _in_file(path: str, body: Callable[[], None]) -> Callable[[], None]:
    """``body`` called from a function whose code says it lives in ``path``: a framework's frame without the framework."""
    namespace: dict[str, object] = {"body": body}
    exec(compile("def framework_step():\n    body()\n", path, "exec"), namespace)
    return namespace["framework_step"]  # type: ignore[return-value]


def _step_once(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


def test_the_step_cycle_reads_the_loop_from_the_first_optimizer_steps_stack():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters())
    cycle = StepCycle(lambda: None)
    try:
        _in_file(SITE + "lightning/pytorch/loops/optimization/automatic.py", lambda: _step_once(optimizer, model))()
    finally:
        cycle.remove()
    assert cycle.loop is Loop.LIGHTNING


def test_a_real_lightning_fabric_loop_is_fabrics():
    # Fabric wraps the optimizer (lightning/fabric/wrappers.py) and steps it through its strategy and precision.
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    net = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters()))
    cycle = StepCycle(lambda: None)
    try:
        fabric.backward(model(torch.randn(2, 4)).sum())
        optimizer.step()
    finally:
        cycle.remove()
    assert cycle.loop is Loop.LIGHTNING_FABRIC


def test_the_step_cycle_of_a_plain_loop_names_no_owner():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters())
    cycle = StepCycle(lambda: None)
    try:
        _step_once(optimizer, model)
    finally:
        cycle.remove()
    assert cycle.loop is None


def _trace_header(tmp_path: Path, loop: Loop | None) -> dict[str, object]:
    capture = Capture(_window(tmp_path, start=2, steps=2), INFO, lambda _: None, lambda: None, loop=loop)
    _train(capture, range(1, 6))
    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    return {k: v for k, v in trace.items() if k != "traceEvents"}


def test_a_window_writes_whose_loop_it_is_into_the_trace(tmp_path):
    assert _trace_header(tmp_path, Loop.TRANSFORMERS_TRAINER)[METADATA_KEY] == "transformers_trainer"


def test_a_window_of_the_jobs_own_loop_writes_no_owner(tmp_path):
    assert METADATA_KEY not in _trace_header(tmp_path, None)


def test_with_explicit_steps_the_window_takes_the_loop_from_the_training_threads_stack(tmp_path):
    # No optimizer hook (agent.step() calls): the poll thread arms the window while the training thread is in the loop.
    parked, release = threading.Event(), threading.Event()

    def wait() -> None:
        parked.set()
        release.wait(30)

    trainer = threading.Thread(target=_in_file(SITE + "transformers/trainer.py", wait))
    trainer.start()
    try:
        assert parked.wait(30)
        agent = Agent(INFO)  # never started: no poll thread, no controller
        agent.training_thread = trainer.ident
        agent._arm(_window(tmp_path, start=2, steps=1))
    finally:
        release.set()
        trainer.join(30)
    assert agent.step_cycle is None
    assert agent.capture is not None and agent.capture.loop is Loop.TRANSFORMERS_TRAINER
