"""Where the model runs without a marker (rule 9 of the phase split): from the batch's fetch to each backward pass.

A forward needs no span of its own (a Hugging Face model without with_stack has none), so the time before a backward
pass is the forward, but only from the fetch of the batch it runs on: what the loop does before that (a checkpoint
save, an evaluation, logging) is not the model's. A gradient-accumulation step runs one forward per micro-batch, the
later ones between two backward passes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.intervals import clip, intersect, subtract, total, union
from orchestrator.analysis.phases import backward_passes, batch_fetch, unmarked_forward
from tests.support.tracefiles import case, load_trace

_FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _events(name: str) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    (path,) = (case(name) / "traces").iterdir()
    events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    return events, steps


def _in(events: list[dict[str, Any]], name: str, step: tuple[float, float]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["name"] == name and step[0] <= e["ts"] < step[1]), key=lambda e: e["ts"])


def test_each_micro_batchs_forward_is_forward_in_a_trainer_that_accumulates() -> None:
    # A transformers Trainer with gradient_accumulation_steps=2: per step, two passes of GPT-2 (embedding first, the
    # loss last) and two backward passes; the second forward runs between them. Before, only the time before the
    # first backward was forward and the second micro-batch's model was "other" (forward 14.7 ms, other 56.3 ms of
    # a 112 ms step with four micro-batches).
    events, steps = _events("cpu_hf_trainer_accumulate")
    (rank,) = analyze_folder(case("cpu_hf_trainer_accumulate")).ranks
    for step, breakdown in zip(steps, rank.steps, strict=True):
        losses = _in(events, "aten::cross_entropy_loss", step)
        assert len(losses) == 2
        # Each micro-batch's model: from its first embedding (the token embedding; the position's follows) to its loss.
        ends = [step[0]] + [loss["ts"] + loss["dur"] for loss in losses]
        starts = [next(e["ts"] for e in _in(events, "aten::embedding", step) if e["ts"] >= after) for after in ends[:-1]]
        model = sum(end - start for start, end in zip(starts, ends[1:]))
        # The model's own reads (the attention mask's check) are syncs wherever they run.
        assert breakdown.phases.forward + breakdown.phases.sync >= 0.95 * model / 1000


def test_a_checkpoint_saved_before_the_step_fetches_its_batch_is_not_forward() -> None:
    # save_steps=3: the Trainer writes its checkpoint after the third optimizer step, before the fourth step fetches
    # its batch. Before, that save (170 ms against a 25 ms step) was the middle step's "forward".
    events, steps = _events("cpu_hf_trainer_save")
    (rank,) = analyze_folder(case("cpu_hf_trainer_save")).ranks
    heads = [(_in(events, _FETCH, step)[-1]["ts"] - step[0]) / 1000 for step in steps]
    saved = max(range(len(steps)), key=lambda i: heads[i])
    others = [s for i, s in enumerate(rank.steps) if i != saved]
    assert heads[saved] > 3 * max(s.duration_ms for s in others)
    middle = rank.steps[saved]
    assert middle.phases.other >= 0.95 * heads[saved]
    assert middle.phases.forward <= 2 * max(s.phases.forward for s in others)


def test_the_engines_gaps_between_its_nodes_are_no_forward() -> None:
    # One backward pass of two nodes with no op of the main thread between them: the gap is the engine's.
    remaining = [(0.0, 100.0)]
    passes = backward_passes([(10.0, 20.0), (21.0, 30.0)], op_starts=[2.0])
    assert passes == [(10.0, 30.0)]
    assert unmarked_forward(0.0, 100.0, remaining, passes, []) == [(0.0, 10.0)]


def test_an_op_between_two_backward_passes_starts_the_next_micro_batchs_forward() -> None:
    remaining = [(0.0, 100.0)]
    found = unmarked_forward(0.0, 100.0, remaining, backward_passes([(10.0, 20.0), (40.0, 50.0)], [2.0, 25.0]), [])
    assert found == [(0.0, 10.0), (20.0, 40.0)]


def test_the_forward_starts_where_its_batch_was_fetched() -> None:
    # What runs before the fetch (a save, an evaluation) is not the forward on the batch fetched after it.
    remaining = subtract([(0.0, 100.0)], [(30.0, 35.0)])
    assert unmarked_forward(0.0, 100.0, remaining, [(60.0, 90.0)], [(30.0, 35.0)]) == [(35.0, 60.0)]


def test_a_step_without_backward_is_the_models_from_its_first_fetch_to_its_end() -> None:
    # Inference: a transformers pipeline runs five batches in one step of TraceLens' OWLv2 trace, each fetched first.
    fetches = [(5.0, 6.0), (50.0, 55.0)]
    remaining = subtract([(0.0, 100.0)], fetches)
    assert unmarked_forward(0.0, 100.0, remaining, [], fetches) == [(6.0, 50.0), (55.0, 100.0)]


def test_a_trainers_micro_batches_fetched_at_once_are_one_batch_fetch() -> None:
    # transformers' Trainer fetches every micro-batch of a step before the first forward: no op between them.
    assert batch_fetch(0.0, 100.0, [(60.0, 90.0)], [(10.0, 12.0), (12.5, 14.0), (14.2, 16.0)], [1.0, 20.0]) == 10.0


def test_an_evaluations_fetches_before_the_batch_are_not_the_batch_fetch() -> None:
    # Lightning validates before the step fetches its batch: fetch, the model (ops), fetch, the model, then the batch.
    fetches = [(5.0, 6.0), (20.0, 21.0), (40.0, 42.0)]
    assert batch_fetch(0.0, 100.0, [(60.0, 90.0)], fetches, [7.0, 22.0, 45.0]) == 40.0
    # Without backward (inference) the first fetch is the batch's.
    assert batch_fetch(0.0, 100.0, [], fetches, [7.0, 22.0, 45.0]) == 5.0


_times = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), max_size=8).map(
    lambda raw: union((float(a), float(a + d)) for a, d in raw)
)


@settings(max_examples=300, deadline=None)
@given(remaining=_times, backward=_times, fetches=_times, ops=st.lists(st.integers(0, 240), max_size=12))
def test_the_unmarked_forward_is_remaining_time_of_the_step_outside_backward(
    remaining: list[tuple[float, float]], backward: list[tuple[float, float]], fetches: list[tuple[float, float]],
    ops: list[int],
) -> None:
    passes = backward_passes(clip(backward, 20.0, 180.0), sorted(float(o) for o in ops))
    found = unmarked_forward(20.0, 180.0, remaining, passes, fetches)
    assert found == union(found)
    assert total(intersect(found, remaining)) == pytest.approx(total(found))
    assert not intersect(found, backward)
    assert all(20.0 <= a and b <= 180.0 for a, b in found)
    # Nothing after the step's last backward pass is a forward.
    last = max((b for a, b in backward if a < 180.0 and b > 20.0), default=None)
    assert last is None or all(b <= last for _, b in found)
    # Nothing before the batch's fetch is either: the last before the first backward, the first in a step without.
    first = min((max(a, 20.0) for a, b in backward if a < 180.0 and b > 20.0), default=None)
    before = 180.0 if first is None else first
    fetched = [min(b, before) for a, b in fetches if a < before and b > 20.0]
    fetch = (max if first is not None else min)(fetched, default=20.0)
    assert all(a >= fetch for a, _ in found)
