"""A DataLoader-bound step's loading, named from a with_stack trace's Python frames: the hot path inside the loader
(by call path, not by name), who iterates it (a transformers pipeline or Trainer, the user's loop), and the fix that
follows from both.

Shaped after TraceLens' H100 and MI300 recordings of a transformers zero-shot-detection pipeline (OWLv2, not
shared): DataLoader next() was 51% and 64% of the step and the fix was "raise DataLoader num_workers" in a DataLoader
the user never built; 69% of the loading was scipy's zoom, called from the model's image processor's resize."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.python_frames import enclosing, hot_path, user_frames
from orchestrator.models.analysis import Finding
from orchestrator.traces.loader import PYTHON_FRAME, Span
from tests.support.realtraces import external, finding
from tests.support.tracefiles import write_trace, x_event
from tests.unit.test_analysis_cpu_foreign import cpu_case
from tests.unit.test_analysis_idle_causes import kernel, launch

NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
ZOOM = "scipy/ndimage/_interpolation.py(739): zoom"
RESIZE = "transformers/models/owlv2/image_processing_owlv2.py(301): resize"


def _frame(name: str, ts: float, dur: float) -> dict[str, Any]:
    return x_event(name, ts, dur, cat="python_function")


def _loading(tmp_path: Path, around: list[str], inside: list[dict[str, Any]]) -> Finding:
    """A 10 ms step that waits 6 ms in DataLoader next() (the device idle), inside the ``around`` frames (outermost
    first, each over the whole step) and running the ``inside`` ones; the dataloader_bound finding."""
    events = [
        x_event("ProfilerStep#1", 0, 10_000, cat="user_annotation"),
        *(_frame(name, -10 - i, 10_020 - i) for i, name in enumerate(around)),
        x_event(NEXT, 0, 6_000, cat="user_annotation"),
        *inside,
        launch(6_100, 1), kernel(6_200, 3_700, 1),
    ]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    return finding(analyze_folder(tmp_path), "dataloader_bound")


PIPELINE = ["transformers/pipelines/zero_shot_object_detection.py(65): __call__", "transformers/pipelines/pt_utils.py(117): __next__"]


def _image_processor(ts: float, dur: float) -> list[dict[str, Any]]:
    return [
        _frame("transformers/models/owlv2/image_processing_owlv2.py(368): preprocess", ts, dur),
        _frame(RESIZE, ts + 10, dur - 300),
        _frame(ZOOM, ts + 20, dur - 400),
    ]


def _pipeline_preprocess() -> list[dict[str, Any]]:
    # The pipeline's preprocess is a generator: Python names each resumption by the line it resumes at.
    return [
        _frame("transformers/pipelines/pt_utils.py(180): __next__", 50, 5_900),
        _frame("transformers/pipelines/zero_shot_object_detection.py(164): preprocess", 100, 1_500),
        *_image_processor(110, 1_400),
        _frame("transformers/pipelines/zero_shot_object_detection.py(176): preprocess", 1_700, 4_200),
        *_image_processor(1_710, 4_100),
    ]


def test_a_pipelines_loading_is_named_by_its_hot_path_and_told_the_pipelines_own_num_workers(tmp_path: Path) -> None:
    f = _loading(tmp_path, PIPELINE, _pipeline_preprocess())
    # The path through the heavier resumption: zoom runs 3,700 of its 4,100 µs (and 1,000 more under the other).
    assert f"62% of it is in zoom (scipy/ndimage/_interpolation.py:739), called from resize ({RESIZE.split('(')[0]}:301)." in f.evidence
    assert f.fix.startswith("The DataLoader is the transformers pipeline's own")
    assert "pipe(inputs, num_workers=8, batch_size=16)" in f.fix and "raise DataLoader num_workers" not in f.fix


def test_an_image_processor_in_scipy_is_told_its_torchvision_backend(tmp_path: Path) -> None:
    fix = _loading(tmp_path, PIPELINE, _pipeline_preprocess()).fix
    assert "AutoImageProcessor.from_pretrained(name, backend='torchvision')" in fix
    assert "given to the pipeline as image_processor=" in fix


def test_an_image_processor_on_torchvision_already_is_not_told_to_switch(tmp_path: Path) -> None:
    inside = [
        _frame("transformers/models/owlv2/image_processing_owlv2.py(368): preprocess", 100, 5_000),
        _frame("torchvision/transforms/v2/functional/_geometry.py(200): resize", 200, 4_000),
    ]
    fix = _loading(tmp_path, ["train.py(40): main"], inside).fix
    assert "backend='torchvision'" not in fix and fix.startswith("Load batches in parallel with the step: raise DataLoader num_workers")


def test_a_trainers_tokenizing_loader_is_told_its_training_arguments_and_to_tokenize_ahead(tmp_path: Path) -> None:
    around = [
        "transformers/trainer.py(2480): _inner_training_loop",
        "accelerate/data_loader.py(570): __iter__",
        "torch/utils/data/dataloader.py(733): __next__",
    ]
    inside = [_frame("my_collator.py(12): __call__", 100, 5_500), _frame("transformers/tokenization_utils_base.py(2850): __call__", 150, 5_000)]
    f = _loading(tmp_path, around, inside)
    assert "83% of it is in __call__ (transformers/tokenization_utils_base.py:2850), called from __call__ (my_collator.py:12)." in f.evidence
    assert f.fix.startswith("The DataLoader is the transformers Trainer's, built from its TrainingArguments")
    assert "TrainingArguments(dataloader_num_workers=N" in f.fix and "tokenize once, ahead" in f.fix


def test_pil_decoding_in_the_loader_is_told_to_decode_on_the_gpu(tmp_path: Path) -> None:
    inside = [_frame("torchvision/datasets/folder.py(245): __getitem__", 100, 5_800), _frame("PIL/ImageFile.py(260): load", 200, 4_000)]
    f = _loading(tmp_path, ["train.py(40): main"], inside)
    assert "67% of it is in load (PIL/ImageFile.py:260), called from __getitem__ (torchvision/datasets/folder.py:245)." in f.evidence
    assert "torchvision.io.decode_jpeg(data, device='cuda')" in f.fix


def test_loading_spread_over_callees_none_of_them_half_is_named_by_their_caller(tmp_path: Path) -> None:
    inside = [
        _frame("data/dataset.py(30): __getitem__", 100, 5_800),
        _frame("data/augment.py(10): random_crop", 200, 2_500),
        _frame("data/augment.py(50): color_jitter", 2_800, 2_500),
    ]
    f = _loading(tmp_path, ["train.py(40): main"], inside)
    assert "97% of it is in __getitem__ (data/dataset.py:30)." in f.evidence
    assert "move per-item work (decoding, augmentation) out of __getitem__" in f.fix


def test_a_trace_without_stacks_names_no_frame_and_gets_the_general_fix() -> None:
    f = finding(external("tbplugin_resnet50_nw0_a"), "dataloader_bound")
    assert " of it is in " not in f.evidence
    assert f.fix.startswith("Load batches in parallel with the step: raise DataLoader num_workers")


def test_a_real_trainers_loader_is_iterated_by_accelerate_inside_the_trainers_loop() -> None:
    # tests/data/traces/cpu_hf_trainer_stacks (record_cpu_issue29.py, with_stack=True): the frames around next() are
    # accelerate's DataLoaderShard, then the Trainer's get_batch_samples and loop: what the Trainer's fix keys on.
    (rank,) = cpu_case("hf_trainer_stacks").ranks
    callers = [c.name for c in rank.data_callers]
    assert callers[0].startswith("accelerate/data_loader.py(") and callers[0].endswith("): __iter__")
    assert any(c.startswith("transformers/trainer.py(") and c.endswith("): get_batch_samples") for c in callers)


# ---- the frame sweeps --------------------------------------------------------------------


def _spans(*frames: tuple[str, float, float]) -> list[Span]:
    return user_frames(Span(ts=ts, end=ts + dur, name=name, cat=PYTHON_FRAME, pid=1, tid=1) for name, ts, dur in frames)


def test_the_hot_path_follows_calls_not_names() -> None:
    # "b.py(1): g" is the heavier name overall (30 + 25), but under two parents neither of which leads.
    frames = _spans(("a.py(1): f", 0, 100), ("b.py(1): g", 5, 30), ("a.py(9): h", 40, 55), ("b.py(1): g", 45, 25), ("c.py(3): k", 70, 20))
    path = hot_path(frames, [(0, 100)], 0.5)
    assert [(s.name, s.total_ms * 1000) for s in path] == [("a.py(1): f", 100), ("a.py(9): h", 55)]


def test_frames_around_the_pieces_are_not_on_their_hot_path_but_around_them() -> None:
    frames = _spans(("loop.py(1): train", 0, 200), ("lib.py(5): fetch", 10, 80), ("x.py(2): decode", 20, 60))
    assert [s.name for s in hot_path(frames, [(10, 90)], 0.5)] == ["lib.py(5): fetch", "x.py(2): decode"]
    assert [s.name for s in enclosing(frames, [(25, 75)], depth=6)] == ["x.py(2): decode", "lib.py(5): fetch", "loop.py(1): train"]
    assert [s.name for s in enclosing(frames, [(25, 75)], depth=1)] == ["x.py(2): decode"]


# A call tree on one thread: each frame (a name of a few, so names repeat) holds children laid end to end inside it.
_NAMES = st.sampled_from(["a.py(1): f", "b.py(2): g", "c.py(3): h", "lib/x.py(4): k"])


@st.composite
def _tree(draw: st.DrawFn, start: float = 0.0, end: float = 1000.0, depth: int = 0) -> list[tuple[str, float, float]]:
    out: list[tuple[str, float, float]] = []
    at = start
    for _ in range(draw(st.integers(0, 3 if depth < 4 else 0))):
        gap, length = draw(st.floats(0, 50)), draw(st.floats(1, 400))
        s, e = at + gap, min(at + gap + length, end)
        if e - s < 1:
            break
        out.append((draw(_NAMES), s, e - s))
        out += draw(_tree(s, e, depth + 1))
        at = e
    return out


@st.composite
def _pieces(draw: st.DrawFn) -> list[tuple[float, float]]:
    cuts = sorted(set(draw(st.lists(st.floats(0, 1000), min_size=2, max_size=8))))
    return [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]


@given(_tree(), _pieces(), st.floats(0.05, 1.0))
def test_the_hot_path_is_a_chain_of_nested_frames_each_holding_the_share(
    tree: list[tuple[str, float, float]], pieces: list[tuple[float, float]], share: float
) -> None:
    frames = _spans(*tree)
    path = hot_path(frames, pieces, share)
    held = sum(b - a for a, b in pieces)
    times = [s.total_ms * 1000 for s in path]
    assert all(t >= share * held - 1e-6 for t in times)
    assert times == sorted(times, reverse=True) and all(t <= held + 1e-6 for t in times)
    assert {s.name for s in path} <= {f.name for f in frames}


@given(_tree(), _pieces(), st.integers(1, 6))
def test_the_frames_around_the_pieces_hold_no_more_than_the_pieces(
    tree: list[tuple[str, float, float]], pieces: list[tuple[float, float]], depth: int
) -> None:
    frames = _spans(*tree)
    around = enclosing(frames, pieces, depth)
    held = sum(b - a for a, b in pieces)
    assert all(s.total_ms * 1000 <= held + 1e-6 and 1 <= s.calls <= len(pieces) for s in around)
    # Each named frame encloses some piece whole.
    for s in around:
        assert any(f.name == s.name and f.ts <= a and b <= f.end for f in frames for a, b in pieces)


def test_a_recursive_frame_around_a_piece_counts_it_once() -> None:
    # Found by the property above: f inside f around a 10 µs piece was 2 calls and 20 µs.
    frames = _spans(("a.py(1): f", 0, 100), ("a.py(1): f", 10, 80))
    assert [(s.name, s.calls, s.total_ms * 1000) for s in enclosing(frames, [(20, 30)], depth=6)] == [("a.py(1): f", 1, 10)]


def test_a_frame_over_two_pieces_holds_its_time_in_both() -> None:
    # Found by the property above: a frame opened in one piece and still open in the next held only the first
    # piece's time, less than a callee of it in the second.
    frames = _spans(("a.py(1): f", 5, 30), ("b.py(2): g", 22, 10))
    path = hot_path(frames, [(0, 10), (20, 40)], 0.1)
    assert [(s.name, s.total_ms * 1000) for s in path] == [("a.py(1): f", 20), ("b.py(2): g", 10)]
