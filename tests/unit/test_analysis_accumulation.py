"""Gradient accumulation that all-reduces every micro-batch, told with the no_sync() change; the same loop under
no_sync(), and a framework's accumulation, told nothing.

Recorded by tests/data/record_cpu_loops.py: two gloo ranks of an MLP under DDP accumulating four micro-batches a step
(cpu_ddp_accumulate: every backward all-reduces; cpu_ddp_no_sync: the first three under no_sync(), one all-reduce a
step, 52 ms a step against 82 ms), the same under FSDP2 (cpu_fsdp2_accumulate), and a Lightning Trainer under DDP
with accumulate_grad_batches=4 (cpu_lightning_ddp_accumulate). Before this rule the first was told "Communication does not overlap computation"
with a smaller bucket_cap_mb as its first fix.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.accumulation import Rounds, accumulation_sync, early_rounds
from orchestrator.analysis.phases import Reductions
from orchestrator.loops import Loop
from orchestrator.traces.loader import Span
from tests.support.tracefiles import case, write_trace, x_event


def finding(summary, code):
    return next((f for f in summary.findings if f.code == code), None)


def span(name: str, ts: float, end: float) -> Span:
    return Span(ts=ts, end=end, name=name, cat="cpu_op", pid=1, tid=1)


def reductions(reduce_at: list[float], steps: list[tuple[float, float]]) -> Reductions:
    """Reductions of one thread whose all-reduces start at ``reduce_at`` and whose optimizer steps run over ``steps``."""
    spans = [span("c10d::allreduce_", t, t + 1) for t in reduce_at] + [span("Optimizer.step#SGD.step", a, b) for a, b in steps]
    kinds: dict[tuple[str, str], list[Span]] = {}
    for s in spans:
        kinds.setdefault((s.name, s.cat), []).append(s)
    return Reductions([kinds], kinds)


def test_accumulating_under_ddp_without_no_sync_is_the_first_finding_with_the_no_sync_change():
    summary = analyze_folder(case("cpu_ddp_accumulate"))
    found = summary.findings[0]
    assert found.code == "accumulation_sync" and found.severity == "warning" and found.ranks == [0, 1]
    assert "runs 4 backward passes before its optimizer step, and 4 of them all-reduce" in found.evidence
    assert "3 of those rounds send partial sums" in found.evidence
    assert "first 3 micro-batches under DDP's no_sync()" in found.fix


def test_each_step_counts_its_passes_its_all_reduces_and_the_early_ones():
    for r in analyze_folder(case("cpu_ddp_accumulate")).ranks:
        assert {(s.backward.passes, s.backward.reducing, s.backward.early) for s in r.steps} == {(4, 4, 3)}
        assert early_rounds(r) == Rounds(passes=4, reducing=4, early=3)


def test_the_same_loop_under_no_sync_all_reduces_once_a_step_and_is_told_nothing():
    summary = analyze_folder(case("cpu_ddp_no_sync"))
    for r in summary.ranks:
        assert {(s.backward.passes, s.backward.reducing, s.backward.early) for s in r.steps} == {(4, 1, 0)}
    assert summary.findings == []


def test_the_early_rounds_are_not_told_again_as_exposed_communication():
    summary = analyze_folder(case("cpu_ddp_accumulate"))
    assert finding(summary, "comm_exposed") is None


def test_lightnings_accumulation_skips_the_sync_itself_and_is_told_nothing():
    summary = analyze_folder(case("cpu_lightning_ddp_accumulate"))
    assert finding(summary, "accumulation_sync") is None
    assert all(s.backward.early == 0 for r in summary.ranks for s in r.steps)


def test_fsdp_reducing_every_micro_batch_is_told_its_own_switch_and_what_it_costs_in_memory():
    summary = analyze_folder(case("cpu_fsdp2_accumulate"))
    found = finding(summary, "accumulation_sync")
    assert found is not None and found.title.startswith("FSDP reduce-scatters the gradients after every micro-batch")
    assert "set_requires_gradient_sync(False)" in found.fix and "only where memory allows" in found.fix


def test_fsdps_gathers_are_no_part_of_what_its_early_reductions_cost():
    # FSDP gathers its parameters for every micro-batch whatever the accumulation does: only its reduce counts.
    summary = analyze_folder(case("cpu_fsdp2_accumulate"))
    found = finding(summary, "accumulation_sync")
    # Three of four rounds of all its collectives would be over 0.75 of the wait; its reduce is under half of it.
    assert found.max_saving_ms < 0.5 * min(r.comm_wait_ms for r in summary.ranks)


def test_in_accelerates_loop_the_fix_names_its_accumulate_context():
    ranks = [r.model_copy(update={"loop": Loop.ACCELERATE}) for r in analyze_folder(case("cpu_ddp_accumulate")).ranks]
    found = accumulation_sync(ranks, [])
    assert found is not None and "accelerator.accumulate(model)" in found.fix


def test_deepspeeds_engine_is_told_its_accumulation_key_not_another_librarys():
    ranks = [r.model_copy(update={"ddp": False, "loop": Loop.DEEPSPEED}) for r in analyze_folder(case("cpu_ddp_accumulate")).ranks]
    found = accumulation_sync(ranks, [])
    assert found is not None and '"gradient_accumulation_steps": N' in found.fix and "engine.step()" in found.fix
    assert "Horovod" not in found.fix


def test_all_reduces_from_gradient_hooks_without_ddp_are_told_the_hooks_change():
    ranks = [r.model_copy(update={"ddp": False}) for r in analyze_folder(case("cpu_ddp_accumulate")).ranks]
    found = accumulation_sync(ranks, [])
    assert found is not None and found.title.startswith("The job all-reduces")
    assert "backward_passes_per_step=4" in found.fix


def test_two_models_each_stepped_after_its_own_backward_sync_nothing_early():
    # A GAN under DDP: the discriminator's pass all-reduces and its optimizer steps, then the generator's.
    counted = reductions([5, 25], [(12, 15), (32, 35)]).of([(0, 10), (20, 30)])
    assert (counted.passes, counted.reducing, counted.early) == (2, 2, 0)


def test_a_reducing_pass_followed_by_another_before_any_optimizer_step_is_early():
    counted = reductions([5, 25, 45], [(52, 55)]).of([(0, 10), (20, 30), (40, 50)])
    assert (counted.passes, counted.reducing, counted.early) == (3, 3, 2)


def test_a_closure_optimizers_passes_inside_its_step_are_the_steps_own():
    # LBFGS evaluates the loss several times inside one step, each backward all-reducing whole gradients.
    counted = reductions([5, 15, 25], [(0, 40)]).of([(2, 8), (12, 18), (22, 28)])
    assert (counted.passes, counted.reducing, counted.early) == (0, 0, 0)


def test_a_pass_that_starts_no_all_reduce_is_not_a_round():
    counted = reductions([25], [(32, 35)]).of([(0, 10), (20, 30)])
    assert (counted.passes, counted.reducing, counted.early) == (2, 1, 0)


def test_all_reduces_the_autograd_thread_launches_count_for_its_passes(tmp_path: Path):
    # GPU-shaped: the main thread runs two micro-batches' forward ops, and between them waits in backward while the
    # autograd engine's device thread runs the nodes, DDP's bucket all-reduce launched from inside one of them.
    events = [x_event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    for start in (0, 400):
        events += [
            x_event("DistributedDataParallel.forward", start + 10, 100, cat="user_annotation"),
            x_event("aten::linear", start + 20, 80),
            x_event("autograd::engine::evaluate_function: AddmmBackward0", start + 150, 200, tid=2),
            x_event("c10d::allreduce_", start + 300, 20, tid=2),
        ]
    events.append(x_event("Optimizer.step#AdamW.step", 850, 100, cat="user_annotation"))
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    (rank,) = analyze_folder(tmp_path).ranks
    counted = rank.steps[0].backward
    assert (counted.passes, counted.reducing, counted.early) == (2, 2, 1)


@given(
    st.lists(st.integers(0, 99), max_size=12, unique=True),
    st.lists(st.integers(0, 1000), max_size=20),
    st.lists(st.integers(0, 99), max_size=4, unique=True),
)
def test_counts_hold_together_for_any_passes_reductions_and_steps(pass_slots, reduce_at, step_slots):
    # Passes and optimizer steps in disjoint 10 µs slots of a 1 ms step: early rounds are reducing passes, one fewer
    # at most; reducing passes are passes; nothing inside an optimizer step counts.
    steps = [(10.0 * i, 10.0 * i + 5) for i in sorted(step_slots)]
    passes = [(10.0 * i, 10.0 * i + 5) for i in sorted(set(pass_slots) - set(step_slots))]
    counted = reductions(sorted(float(t) for t in reduce_at), steps).of(passes)
    assert 0 <= counted.early <= max(0, counted.reducing - 1) and counted.reducing <= counted.passes == len(passes)
    if not steps:
        assert counted.early == max(0, counted.reducing - 1)
