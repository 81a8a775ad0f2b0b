"""What one step holds, counted in the trace, and how the report, the CLI and the MCP answer say it (issue 29, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from actors.agent.step_cycle import StepCycle
from orchestrator.analysis import analyze_folder
from orchestrator.analysis.report import render_report
from orchestrator.analysis.step_content import one_step
from orchestrator.cli.main import main
from orchestrator.mcp.convert import analysis_of
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.realtraces import external
from tests.support.tracefiles import case, write_trace, x_event

GAN = "1 step = SGD.step ×1 + Adam.step ×1"


def _manifest(summary: object, *definitions: str | None) -> Manifest:
    return Manifest(
        profile_id="p-1",
        target="gan",
        status=ProfileState.DONE,
        request=ProfileRequest(target="gan", steps=3),
        storage_uri="file:///p",
        start_step=2,
        stop_step=5,
        ranks=[RankResult(rank=r, state=RankState.DONE, step_definition=d) for r, d in enumerate(definitions)],
        artifacts=[],
        requested_at=utcnow(),
        finished_at=utcnow(),
        summary=summary,
    )


def test_a_gan_step_holds_both_optimizers_and_every_model_forward_but_not_the_loss() -> None:
    # Recorded with torch.profiler and the Python tracer (tests/data/make_phase_traces.py gan): per
    # iteration the generator runs once, the discriminator three times (real, fake for D, fake for G),
    # and the BCE loss module three times.
    summary = analyze_folder(case("gan"))
    assert summary.step_definition == f"{GAN}; 4 forward passes (Sequential_1 ×3, Sequential_0 ×1)"
    assert summary.ranks[0].step_definition == summary.step_definition


def test_a_wrapping_optimizer_counts_once_with_what_it_steps_inside_and_a_forward_annotation_is_one_pass() -> None:
    # TorchRec's CombinedOptimizer steps the optimizers it holds inside its own step (HTA's MTIA trace).
    assert external("hta_mtia_single_rank").step_definition == (
        "1 step = CombinedOptimizer.step ×1 (inside: CombinedOptimizer.step ×4 + Adam.step ×1); 1 forward pass"
    )


class Combined(torch.optim.Optimizer):
    """As TorchRec's CombinedOptimizer: holds optimizers and steps each inside its own step."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        super().__init__([p for o in optimizers for g in o.param_groups for p in g["params"]], {})

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for o in self.optimizers:
            o.step()


def test_the_agents_count_and_the_traces_agree_on_a_wrapping_optimizer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    opt = Combined([torch.optim.Adam(a.parameters()), torch.optim.SGD(b.parameters(), lr=0.1)])
    steps: list[int] = []
    cycle = StepCycle(lambda: steps.append(1))
    trace = tmp_path / "rank0.pt.trace.json"
    try:
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=10, warmup=1, active=3),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
            for _ in range(14):
                opt.zero_grad()
                b(a(torch.randn(4, 8))).pow(2).mean().backward()
                opt.step()
                prof.step()
    finally:
        cycle.remove()
    assert len(steps) == 14
    assert cycle.definition == "1 step = Combined.step ×1 (inside: Adam.step ×1 + SGD.step ×1); 2 forward passes (Linear)"
    summary = analyze_folder(tmp_path)
    # Recorded without Python stacks: the trace shows no forward pass, the agent's count stands.
    assert one_step(summary, _manifest(None, cycle.definition)) == (
        "One step (as the agent counted it, the trace showing the same optimizer steps): "
        "Combined.step ×1 (inside: Adam.step ×1 + SGD.step ×1); 2 forward passes (Linear)."
    )


def test_the_order_the_agent_lists_optimizers_in_does_not_make_a_difference() -> None:
    # The agent lists them as their steps end, the trace as they start.
    summary = external("hta_mtia_single_rank")
    agent = "1 step = CombinedOptimizer.step ×1 (inside: Adam.step ×1 + CombinedOptimizer.step ×4)"
    assert (one_step(summary, _manifest(None, agent)) or "").startswith("One step (as the agent counted it and the trace shows)")
    other = "1 step = CombinedOptimizer.step ×1 (inside: Adam.step ×2 + CombinedOptimizer.step ×4)"
    assert (one_step(summary, _manifest(None, other)) or "").startswith("One step (as the agent counted it): ")


def test_ddp_forward_names_the_wrapper_module() -> None:
    assert analyze_folder(case("healthy")).step_definition == "1 step = SGD.step ×1; 1 forward pass (DistributedDataParallel)"


def test_a_trace_without_optimizer_steps_or_forward_markers_says_nothing() -> None:
    assert external("hta_cpu_only_r34of300").step_definition is None


def test_the_most_common_count_wins_and_a_short_last_step_does_not_empty_it(tmp_path: Path) -> None:
    # Step 1 runs the optimizer twice (its state built lazily, say), steps 2 and 3 once, step 4 is cut short.
    events = [x_event(f"ProfilerStep#{n}", n * 1000, 900 if n < 4 else 50, cat="user_annotation") for n in (1, 2, 3, 4)]
    events += [x_event("Optimizer.step#AdamW.step", t, 50, cat="user_annotation") for t in (1100, 1300, 2100, 3100)]
    events += [x_event("## forward ##", t, 50, cat="user_annotation") for t in (1010, 2010, 2200, 3010, 3200)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    assert analyze_folder(tmp_path).step_definition == "1 step = AdamW.step ×1; 2 forward passes"


def test_steps_that_are_micro_batches_say_they_are_part_of_an_iteration(tmp_path: Path) -> None:
    # A loop with gradient accumulation over two micro-batches that calls prof.step() per micro-batch (recorded so
    # with accelerate's accumulate(): AdamW steps in ProfilerStep#3 alone of #2-#4). Before: "no optimizer step".
    events = [x_event(f"ProfilerStep#{n}", n * 1000, 900, cat="user_annotation") for n in (2, 3, 4)]
    events += [x_event("Optimizer.step#AdamW.step", 3600, 50, cat="user_annotation")]
    events += [x_event("## forward ##", n * 1000 + 10, 50, cat="user_annotation") for n in (2, 3, 4)]
    events += [x_event("autograd::engine::evaluate_function: AddmmBackward0", n * 1000 + 100, 50) for n in (2, 3, 4)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    assert analyze_folder(tmp_path).step_definition == (
        "1 step = part of an iteration (AdamW.step ×1 in 1 of 3 steps: a step per micro-batch of gradient accumulation); "
        "1 forward pass"
    )


def test_steps_that_run_no_backward_beside_training_steps_are_said_to_be_evaluation(tmp_path: Path) -> None:
    # Two training steps, then three validation batches in the same window (a profiler stepped per batch, as
    # Lightning's is).
    events = [x_event(f"ProfilerStep#{n}", n * 1000, 900, cat="user_annotation") for n in range(1, 6)]
    events += [x_event("## forward ##", n * 1000 + 10, 50, cat="user_annotation") for n in range(1, 6)]
    events += [x_event("autograd::engine::evaluate_function: AddmmBackward0", n * 1000 + 100, 50) for n in (1, 2)]
    events += [x_event("Optimizer.step#AdamW.step", n * 1000 + 600, 50, cat="user_annotation") for n in (1, 2)]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    assert analyze_folder(tmp_path).step_definition == (
        "1 step = AdamW.step ×1 in 2 of 5 steps (the other 3 run no backward: evaluation batches); 1 forward pass"
    )


@pytest.mark.parametrize("stepped", [(1, 2, 3), (2, 3, 4), (1, 3, 4)])
def test_one_step_without_the_optimizer_among_three_or_more_is_no_micro_batch(tmp_path: Path, stepped: tuple[int, ...]) -> None:
    events = [x_event(f"ProfilerStep#{n}", n * 1000, 900, cat="user_annotation") for n in (1, 2, 3, 4)]
    events += [x_event("Optimizer.step#AdamW.step", n * 1000 + 600, 50, cat="user_annotation") for n in stepped]
    write_trace(tmp_path / "rank0.pt.trace.json", events, world_size=1)
    assert analyze_folder(tmp_path).step_definition == "1 step = AdamW.step ×1"


def test_ranks_whose_steps_hold_different_work_are_noted(tmp_path: Path) -> None:
    for rank, optimizer in ((0, "SGD"), (1, "Adam")):
        events = [x_event(f"ProfilerStep#{n}", n * 1000, 900, cat="user_annotation") for n in (1, 2)]
        events += [x_event(f"Optimizer.step#{optimizer}.step", n * 1000 + 500, 100, cat="user_annotation") for n in (1, 2)]
        write_trace(tmp_path / f"rank{rank}.pt.trace.json", events, rank=rank, world_size=2)
    summary = analyze_folder(tmp_path)
    assert any("steps hold different work" in issue and "rank 1: 1 step = Adam.step ×1" in issue for issue in summary.issues)


@pytest.mark.parametrize(
    ("agent", "sentence"),
    [
        (None, "One step (as the trace shows): SGD.step ×1 + Adam.step ×1; 4 forward passes (Sequential_1 ×3, Sequential_0 ×1)."),
        (GAN, "One step (as the agent counted it and the trace shows): SGD.step ×1 + Adam.step ×1; 4 forward passes"),
        (
            "1 step = 1 actors.agent.step() call",
            "One step (as the agent counted it): 1 actors.agent.step() call; in the trace each step holds SGD.step ×1 + Adam.step ×1;",
        ),
    ],
)
def test_the_report_says_what_the_agent_counted_and_what_the_trace_holds(agent: str | None, sentence: str) -> None:
    summary = analyze_folder(case("gan"))
    html = render_report(summary, _manifest(None, agent, agent))
    assert sentence in html
    assert sentence in (one_step(summary, _manifest(None, agent)) or "")


def test_the_agents_count_alone_is_said_when_the_trace_shows_neither() -> None:
    summary = external("hta_cpu_only_r34of300")
    assert one_step(summary, _manifest(None, GAN)) == "One step (as the agent counted it): SGD.step ×1 + Adam.step ×1."
    assert one_step(summary) is None


def test_the_mcp_answer_and_the_cli_say_it_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = analyze_folder(case("gan"))
    answer = analysis_of(_manifest(summary, GAN))
    assert answer is not None and answer.one_step == one_step(summary, _manifest(None, GAN))
    folder = tmp_path / "gan"
    (folder / "traces").mkdir(parents=True)
    for trace in (case("gan") / "traces").iterdir():
        (folder / "traces" / trace.name).write_bytes(trace.read_bytes())
    (folder / "manifest.json").write_text(_manifest(None, GAN).model_dump_json())
    assert main(["analyze", str(folder)]) == 0
    assert "One step (as the agent counted it and the trace shows): SGD.step ×1 + Adam.step ×1;" in capsys.readouterr().out
    assert main(["analyze", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["step_definition"].startswith(GAN)


def test_the_agent_and_the_trace_counting_different_forward_passes_are_both_said() -> None:
    summary = analyze_folder(case("gan"))  # 4 forward passes a step
    agent = GAN + "; 3 forward passes (Discriminator ×2, Generator ×1)"
    assert one_step(summary, _manifest(None, agent)) == (
        "One step (as the agent counted it): SGD.step ×1 + Adam.step ×1; 3 forward passes (Discriminator ×2, Generator ×1);"
        " in the trace each step holds SGD.step ×1 + Adam.step ×1; 4 forward passes (Sequential_1 ×3, Sequential_0 ×1)."
    )


def test_the_same_forward_count_under_other_module_names_agrees_in_the_agents_words() -> None:
    # The agent names classes, the trace instances: only the counts are compared, and the classes are said (before:
    # "Sequential_1 ×3, Sequential_0 ×1"; a live Ignite job's "DistributedDataParallel_0" for its model).
    summary = analyze_folder(case("gan"))
    agent = GAN + "; 4 forward passes (Discriminator ×3, Generator ×1)"
    assert one_step(summary, _manifest(None, agent)) == (
        "One step (as the agent counted it and the trace shows): "
        "SGD.step ×1 + Adam.step ×1; 4 forward passes (Discriminator ×3, Generator ×1)."
    )
