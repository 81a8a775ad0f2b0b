"""What a group of ranks is doing, told from its stacks: each case takes the training thread's real stacks (the
agent's own take_stacks, from another thread, as it does on a stuck rank) inside code rayprof did not write: a
transformers Trainer evaluating and saving, Lightning validating and checkpointing, torch.save and torch.load, a
torch.compile backend, a DataLoader fetch, torch.distributed.checkpoint writing its files."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from actors.agent.thread_stacks import take_stacks
from actors.controller.diagnosis.stack_groups import RankDigest, group_stacks, summary_line
from orchestrator.models.diagnosis import Frame, StackGroup

Grab = Callable[[], None]


def inside(run: Callable[[Grab], Any]) -> list[Frame]:
    """The training thread's frames at the first ``grab()`` that ``run`` makes, minus the grab itself."""
    taken: list[list[Frame]] = []

    def grab() -> None:
        if taken:
            return
        me, answer = threading.get_ident(), {}
        agent = threading.Thread(target=lambda: answer.setdefault("s", take_stacks("b", "a", 0, me, native=False)))
        agent.start()
        agent.join()
        (thread,) = [t for t in answer["s"].threads if t.training]
        frames = list(thread.frames)
        taken.append(frames[: next(i for i, f in enumerate(frames) if f.function == "grab")])

    run(grab)
    assert taken, "the code never reached the grab"
    return taken[0]


def grouped(frames: list[Frame]) -> StackGroup:
    (group,) = group_stacks(
        {r: RankDigest(stack=tuple(frames), latest={}, flight_recorder_note=None, native_note=None, truncated=None) for r in (0, 1)}
    )
    return group


def _trainer(tmp_path: Path, grab: Grab, on: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0))
    if on == "evaluate":
        model.register_forward_pre_hook(lambda module, _: None if module.training else grab())
    else:
        model._register_state_dict_hook(lambda *_, **__: grab())
    rows = [{"input_ids": r, "labels": r} for r in torch.randint(0, 50, (8, 8))]
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4, use_cpu=True, report_to="none",
        save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2, logging_strategy="no", disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows).train()


def _lightning(tmp_path: Path, grab: Grab, on: str) -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 1)

        def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
            return self.net(batch[0]).sum()

        def validation_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
            if on == "validate":
                grab()
            return self.net(batch[0]).sum()

        def on_save_checkpoint(self, _: dict[str, Any]) -> None:
            if on == "save":
                grab()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    L.Trainer(
        max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(tmp_path), val_check_interval=2, num_sanity_val_steps=0,
    ).fit(Module(), data, data)


def test_a_trainer_evaluating_is_told_as_evaluating_where_its_evaluate_begins(tmp_path: Path) -> None:
    group = grouped(inside(lambda grab: _trainer(tmp_path, grab, "evaluate")))
    assert group.activity is not None and group.activity.startswith("evaluating (trainer.py:")
    assert group.activity.endswith(" in evaluate)") and not group.waiting
    # Before: "ranks 0, 1 are in inner (module.py:...) from test_stack_activities.py:... in <lambda>", no evaluation.
    assert summary_line([group], []).startswith(f"ranks 0, 1 are {group.activity}, in ")


def test_a_trainer_saving_its_checkpoint_is_told_as_saving(tmp_path: Path) -> None:
    activity = grouped(inside(lambda grab: _trainer(tmp_path, grab, "save"))).activity
    assert activity is not None and activity.startswith("saving a checkpoint (trainer.py:") and "_save_checkpoint" in activity


def test_lightnings_validation_is_evaluating(tmp_path: Path) -> None:
    activity = grouped(inside(lambda grab: _lightning(tmp_path, grab, "validate"))).activity
    assert activity is not None and activity.startswith("evaluating (evaluation_loop.py:")


def test_lightnings_checkpoint_after_validation_is_a_save_inside_the_evaluation(tmp_path: Path) -> None:
    activity = grouped(inside(lambda grab: _lightning(tmp_path, grab, "save"))).activity
    assert activity is not None and activity.startswith("evaluating › saving a checkpoint (trainer.py:")


class _Writer(io.BytesIO):
    def __init__(self, grab: Grab) -> None:
        super().__init__()
        self.grab = grab

    def write(self, b: Any) -> int:
        self.grab()
        return super().write(b)


class _Reader(io.BytesIO):
    def __init__(self, data: bytes, grab: Grab) -> None:
        super().__init__(data)
        self.grab = grab

    def read(self, *args: Any) -> bytes:
        self.grab()
        return super().read(*args)


def test_torch_save_and_torch_load_are_a_checkpoint_saved_and_loaded() -> None:
    saved = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, saved)

    save = grouped(inside(lambda grab: torch.save({"w": torch.zeros(3)}, _Writer(grab)))).activity
    load = grouped(inside(lambda grab: torch.load(_Reader(saved.getvalue(), grab)))).activity

    assert (save or "").startswith("saving a checkpoint (serialization.py:")
    assert (load or "").startswith("loading a checkpoint (serialization.py:")


def test_a_torch_compile_backend_at_work_is_compiling() -> None:
    def run(grab: Grab) -> None:
        def backend(gm: torch.fx.GraphModule, _: Any) -> Any:
            grab()
            return gm.forward

        torch.compile(nn.Linear(2, 2), backend=backend)(torch.zeros(1, 2))

    assert (grouped(inside(run)).activity or "").startswith("compiling with torch.compile (convert_frame.py:")


def test_a_dataloader_fetch_is_fetching_a_batch() -> None:
    class Data(torch.utils.data.Dataset[torch.Tensor]):
        def __init__(self, grab: Grab) -> None:
            self.grab = grab

        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> torch.Tensor:
            self.grab()
            return torch.zeros(2)

    def run(grab: Grab) -> None:
        for _ in torch.utils.data.DataLoader(Data(grab), batch_size=2):
            pass

    activity = grouped(inside(run)).activity or ""
    assert activity.startswith("fetching a batch from a DataLoader (dataloader.py:") and activity.endswith(" in __next__)")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, no process group: said once
def test_torch_distributed_checkpoint_writing_its_files_is_saving_not_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as filesystem

    def run(grab: Grab) -> None:
        write = filesystem._write_files_from_queue

        def writing(*args: Any, **kwargs: Any) -> Any:
            grab()
            return write(*args, **kwargs)

        monkeypatch.setattr(filesystem, "_write_files_from_queue", writing)
        dcp.save({"w": torch.zeros(3)}, checkpoint_id=str(tmp_path / "dcp"))

    group = grouped(inside(run))
    # Before: "ranks 0, 1 wait in _write_data (filesystem.py:...)": any torch.distributed frame made a wait.
    assert not group.waiting
    assert (group.activity or "").startswith("saving a checkpoint (state_dict_saver.py:")


def test_a_models_own_forward_says_no_activity_and_no_wait() -> None:
    net = nn.Linear(2, 2)

    def run(grab: Grab) -> None:
        net.register_forward_pre_hook(lambda *_: grab())
        net(torch.zeros(1, 2))

    group = grouped(inside(run))
    assert group.activity is None and not group.waiting
    assert summary_line([group], []).startswith("ranks 0, 1 are in ")


_TORCH = "/venv/site-packages/torch/"


def test_compute_inside_an_fsdp_wrappers_forward_is_no_wait() -> None:
    # FSDP (1)'s FullyShardedDataParallel.forward is on the stack of all the compute it wraps (it needs a GPU, so
    # its frames are written out here). Before: any torch.distributed frame made the group "wait".
    frames = [
        Frame(filename="/job/train.py", line=41, function="train_loop"),
        Frame(filename=_TORCH + "distributed/fsdp/fully_sharded_data_parallel.py", line=857, function="forward", library=True),
        Frame(filename=_TORCH + "nn/modules/linear.py", line=134, function="forward", library=True),
    ]
    group = grouped(frames)
    assert not group.waiting
    assert summary_line([group], []) == "ranks 0, 1 are in forward (linear.py:134) from train.py:41 in train_loop"


def test_a_tensor_parallel_layer_computing_in_dtensors_dispatch_is_no_wait() -> None:
    # A ColwiseParallel Linear's forward on a DTensor, sampled from another thread (torch 2.13): the local matmul
    # runs from DTensor's dispatch, the innermost Python frame. Before: told as a wait.
    frames = [
        Frame(filename="/job/train.py", line=26, function="train_loop"),
        Frame(filename=_TORCH + "nn/modules/linear.py", line=134, function="forward", library=True),
        Frame(filename=_TORCH + "distributed/tensor/_dispatch.py", line=759, function="wrap", library=True),
    ]
    assert not grouped(frames).waiting


def test_a_collective_a_checkpoint_save_waits_in_is_a_wait_inside_the_save() -> None:
    frames = [
        Frame(filename="/job/train.py", line=41, function="train_loop"),
        Frame(filename=_TORCH + "distributed/checkpoint/state_dict_saver.py", line=196, function="save", library=True),
        Frame(filename=_TORCH + "distributed/distributed_c10d.py", line=3245, function="all_gather_object", library=True),
    ]
    group = grouped(frames)
    assert group.waiting
    assert summary_line([group], []) == (
        "ranks 0, 1 wait in all_gather_object (distributed_c10d.py:3245) from train.py:41 in train_loop, "
        "saving a checkpoint (state_dict_saver.py:196 in save)"
    )


_RAY = "/venv/site-packages/ray/"


def test_a_rank_in_ray_train_report_waits_for_the_others() -> None:
    # The training thread of rank 0 of a Ray Train v2 run (Ray 2.60) whose rank 1 never reached its
    # ray.train.report(), as `rayprof stacks` took it. Before: "rank 0 is in get_objects (worker.py:1007) from
    # loop.py:13 in loop", which said nothing of the wait.
    frames = [
        Frame(filename=_RAY + "train/v2/_internal/util.py", line=89, function="train_fn", library=True),
        Frame(filename="/job/loop.py", line=13, function="loop"),
        Frame(filename=_RAY + "train/v2/api/train_fn_utils.py", line=125, function="report", library=True),
        Frame(filename=_RAY + "train/v2/_internal/execution/train_fn_utils.py", line=172, function="report", library=True),
        Frame(filename=_RAY + "train/v2/_internal/execution/context.py", line=474, function="report", library=True),
        Frame(
            filename=_RAY + "train/v2/_internal/execution/context.py", line=254,
            function="_sync_checkpoint_dir_name_across_ranks", library=True,
        ),
        Frame(filename=_RAY + "_private/auto_init_hook.py", line=22, function="auto_init_wrapper", library=True),
        Frame(filename=_RAY + "_private/client_mode_hook.py", line=134, function="wrapper", library=True),
        Frame(filename=_RAY + "_private/worker.py", line=3009, function="get", library=True),
        Frame(filename=_RAY + "_private/worker.py", line=1007, function="get_objects", library=True),
    ]
    group = grouped(frames)
    assert group.waiting
    assert summary_line([group], []) == (
        "ranks 0, 1 wait in get_objects (worker.py:1007) from loop.py:13 in loop, in ray.train.report, which waits for "
        "every rank (context.py:254 in _sync_checkpoint_dir_name_across_ranks)"
    )


# Ray's images run jobs as the user ray: the job's own files and every package live under /home/ray.
_IMAGE = "/home/ray/anaconda3/lib/python3.11/site-packages/ray/"


@pytest.mark.parametrize(("ray", "job"), [(_RAY, "/job/"), (_IMAGE, "/home/ray/job/")])
def test_a_call_of_the_jobs_own_inside_a_ray_train_barrier_is_no_wait(ray: str, job: str) -> None:
    # Only Ray's own frames inside the synchronisation make it the wait: a callback of the job's own is not.
    # Before, in Ray's image layout: any path holding "/ray/" was Ray's, /home/ray/job/callbacks.py too.
    frames = [
        Frame(filename=job + "loop.py", line=13, function="loop"),
        Frame(filename=ray + "train/v2/_internal/execution/collective_impl.py", line=22, function="barrier", library=True),
        Frame(filename=job + "callbacks.py", line=7, function="on_barrier"),
    ]
    assert not grouped(frames).waiting


def test_in_rays_image_layout_a_rank_in_a_ray_train_barrier_still_waits() -> None:
    frames = [
        Frame(filename="/home/ray/job/loop.py", line=13, function="loop"),
        Frame(filename=_IMAGE + "train/v2/_internal/execution/collective_impl.py", line=22, function="barrier", library=True),
        Frame(filename=_IMAGE + "_private/worker.py", line=3009, function="get", library=True),
    ]
    assert grouped(frames).waiting


_NAMES = ["/job/train.py", _TORCH + "distributed/distributed_c10d.py", _TORCH + "utils/data/dataloader.py",
          _RAY + "_private/worker.py", _RAY + "train/v2/_internal/execution/context.py", "transformers/trainer.py", "", "\\\\"]
_FUNCTIONS = ["__next__", "evaluate", "_sync_checkpoint_dir_name_across_ranks", "get", "all_reduce", "<module>", ""]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.builds(
            Frame,
            filename=st.sampled_from(_NAMES) | st.text(max_size=40),
            line=st.integers(min_value=0, max_value=10**6),
            function=st.sampled_from(_FUNCTIONS) | st.text(max_size=20),
            library=st.booleans(),
        ),
        max_size=12,
    )
)
def test_any_frames_an_agent_sends_group_and_read_as_one_line(frames: list[Frame]) -> None:
    group = grouped(frames)
    line = summary_line([group], [])
    assert line.startswith(f"ranks 0, 1 {'wait' if group.waiting else 'are'} ")
    # What the innermost frame is decides a wait on torch.distributed; frames of the job's own further out do not.
    assert grouped([Frame(filename="/job/outer.py", line=1, function="main"), *frames]).waiting == group.waiting or not frames
