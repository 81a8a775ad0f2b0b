"""What the profiler cost the steps it recorded (orchestrator/analysis/profiler_cost.py): the window's steps against
the rank's steps just before it, as the agent measured and wrote them. The real cases are a LoRA fine-tune (PEFT)
under transformers' Trainer, unmodified (tests/data/record_cpu_pace.py, peft 0.21.2 on torch 2.13.0+cpu)."""

from __future__ import annotations

import functools
import json
from html import escape
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.analysis.diff import diff_profiles
from orchestrator.analysis.diff_inputs import load_folder
from orchestrator.analysis.finding_base import verdict
from orchestrator.analysis.profiler_cost import KERNEL_SHARE, SLOWED, profiler_cost_note, read_steps_before, slowdown
from orchestrator.analysis.report import render_report
from orchestrator.cli.output import print_analysis
from orchestrator.loops import Loop
from orchestrator.mcp.convert import analysis_of
from orchestrator.mcp.resources import report_text
from orchestrator.models.analysis import PhaseTimes, RankSummary, StepBreakdown
from orchestrator.models.common import utcnow
from orchestrator.models.pace import STEPS_BEFORE_METADATA_KEY, StepsBefore
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.thread_time import ThreadTime
from tests.support.common import cli_results
from tests.support.realtraces import only_rank
from tests.support.tracefiles import case


@functools.cache
def lora(name: str) -> Summary:
    return analyze_folder(case(f"cpu_{name}"))


def _rank(
    rank: int, window_ms: float, before_ms: float, steps: int = 4, options: list[str] | None = None, windows_before: int = 1
) -> RankSummary:
    breakdown = [StepBreakdown(step=10 + i, start_unix_us=0.0, duration_ms=window_ms, phases=PhaseTimes()) for i in range(steps)]
    before = StepsBefore(
        step_ms=before_ms, steps=20, span_s=before_ms * 20 / 1000, windows_before=windows_before, options=options or []
    )
    return RankSummary(
        rank=rank, host="h", file="f", device="cpu", steps=breakdown, mean_step_ms=window_ms, median_step_ms=window_ms,
        mean_phases=PhaseTimes(), comm_wait_ms=0.0, steps_before=before,
    )


def test_a_lora_fine_tune_recorded_with_record_shapes_is_said_to_describe_the_profiler_first() -> None:
    summary = lora("peft_lora_shapes")
    r = only_rank(summary)
    assert r.loop is Loop.TRANSFORMERS_TRAINER
    assert r.steps_before is not None and r.steps_before.options == ["record_shapes"]
    assert (slowdown(r) or 0) > 5  # 8.8x when recorded: ~80 ms steps before the window, 280-770 ms in it
    note = summary.caution
    assert note is not None and note.startswith("the profiler slowed the steps it recorded: ")
    assert f"against {r.steps_before.step_ms:.1f} ms over the 15 steps" in note
    assert "It was the process's first window" in note  # the recorder's window was its process's first
    assert "It also recorded with record_shapes=True, which holds a reference to each op's tensors" in note
    assert "if a second window is slow too, profile without record_shapes" in note


def test_the_same_fine_tune_without_record_shapes_runs_at_its_own_pace_and_gets_no_note() -> None:
    summary = lora("peft_lora")
    r = only_rank(summary)
    assert r.steps_before is not None and r.steps_before.options == []
    assert 0.8 < (slowdown(r) or 0) < 1.25
    assert summary.caution is None


def test_a_trace_the_agent_wrote_no_pace_into_gets_no_note() -> None:
    summary = analyze_folder(case("cpu_hf_trainer"))
    assert only_rank(summary).steps_before is None
    assert summary.caution is None


def test_the_cli_the_report_and_the_mcp_answer_say_the_caution_before_the_verdict() -> None:
    summary = lora("peft_lora_shapes")
    caution = summary.caution
    assert caution is not None
    manifest = Manifest(
        profile_id="p-1", target="t", status=ProfileState.DONE, request=ProfileRequest(target="t", steps=6),
        storage_uri="file:///p", start_step=17, stop_step=23, ranks=[], artifacts=[], requested_at=utcnow(),
        finished_at=utcnow(), summary=summary,
    )
    analysis = analysis_of(manifest)
    assert analysis is not None and analysis.caution == caution
    for lines in (report_text(manifest, analysis).splitlines(), cli_results(print_analysis, summary, None)[1].splitlines()):
        assert lines.index(f"caution: {caution}") < next(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    page = render_report(summary)
    assert page.index(f'<p class="verdict">Caution: {escape(caution)}</p>') < page.index(escape(verdict(summary)))


def test_the_note_follows_the_ranks_median_not_one_slow_rank() -> None:
    # One rank slower in the window (its own data, a straggler) is the straggler finding's, not the profiler's.
    ranks = [_rank(0, 100.0, 95.0), _rank(1, 100.0, 98.0), _rank(2, 300.0, 97.0)]
    assert profiler_cost_note(ranks) is None


def test_slowed_ranks_are_named_with_the_worst_and_the_median() -> None:
    ranks = [_rank(0, 300.0, 100.0), _rank(1, 260.0, 100.0), _rank(2, 110.0, 100.0)]
    note = profiler_cost_note(ranks)
    assert note is not None
    assert "300.0 ms a step in the window (median) against 100.0 ms over the 20 steps (2.0 s) just before it on rank 0" in note
    assert "(3.0x; the ranks' median 2.6x, ranks 0, 1 over 1.5x)" in note
    assert "no option that adds to each op's cost" in note and "first window" not in note


def test_the_options_that_add_to_each_ops_cost_are_named_with_what_each_adds() -> None:
    note = profiler_cost_note([_rank(0, 500.0, 100.0, options=["record_shapes", "with_stack"])])
    assert note is not None
    assert "It recorded with record_shapes=True, which holds a reference to each op's tensors until the window closes" in note
    assert "; with_stack=True, which records each op's Python stack:" in note
    assert "profile again without record_shapes and with_stack for the job's own pace" in note


def test_the_training_threads_time_in_the_kernel_is_said_where_it_is_a_part_of_the_step() -> None:
    ran = ThreadTime(wall_s=1.2, cpu_s=1.1, system_s=0.3, minor_faults=104_941, intra_op_threads=1)
    note = profiler_cost_note([_rank(0, 300.0, 100.0).model_copy(update={"thread_time": ran})])
    assert note is not None
    assert "Its training thread spent 75.0 ms a step in the kernel (104,941 page faults in the window)" in note
    light = ran.model_copy(update={"system_s": 0.1})  # 25 ms of a 300 ms step: under the share
    note = profiler_cost_note([_rank(0, 300.0, 100.0).model_copy(update={"thread_time": light})])
    assert note is not None and "in the kernel" not in note
    assert 25.0 < KERNEL_SHARE * 300.0


def test_a_process_s_first_window_is_told_as_such_before_any_option() -> None:
    note = profiler_cost_note([_rank(0, 300.0, 100.0, windows_before=0)])
    assert note is not None
    assert note.endswith(
        "It was the process's first window, whose records take memory new to the process (a later one reuses it): "
        "profile the same steps again to see how much stays (the example job's first windows ran 1.5-3.5x its pace)."
    )


def test_a_window_of_one_step_or_a_pace_under_the_bar_says_nothing() -> None:
    assert slowdown(_rank(0, 900.0, 100.0, steps=1)) is None  # a one-off as likely as a pace
    assert profiler_cost_note([_rank(0, 900.0, 100.0, steps=1)]) is None
    assert profiler_cost_note([_rank(0, SLOWED * 100.0 - 1, 100.0)]) is None
    assert profiler_cost_note([_rank(0, SLOWED * 100.0, 100.0)]) is not None


def test_a_malformed_measure_is_not_read_and_says_why() -> None:
    seen, why = read_steps_before({STEPS_BEFORE_METADATA_KEY: {"step_ms": -1, "steps": 3, "span_s": 1.0}})
    assert seen is None
    assert why is not None and why.startswith("the trace's steps before the window (rayprof_steps_before): malformed")


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["step_ms", "steps", "span_s", "options", "other"]), json_values, max_size=5))
def test_any_value_under_the_key_reads_as_a_measure_or_a_reason_never_an_error(raw: dict[str, Any]) -> None:
    seen, why = read_steps_before({STEPS_BEFORE_METADATA_KEY: json.loads(json.dumps(raw, allow_nan=True))})
    assert (seen is None) != (why is None)
    if seen is not None:
        assert seen.step_ms > 0 and seen.steps >= 1 and seen.span_s > 0


def test_a_diff_against_a_window_the_profiler_slowed_claims_no_change() -> None:
    # The same loop without and with record_shapes: 8.8x "slower" is the profiler's, not the job's.
    a = load_folder(case("cpu_peft_lora"), "without")
    b = load_folder(case("cpu_peft_lora_shapes"), "with")
    diff = diff_profiles(a, b)
    assert not diff.comparable and diff.claims == []
    assert "the profiler slowed the steps of with (8.8x its steps before the window): a change may be its" in diff.not_comparable
    assert not any(reason.startswith("the profiler slowed the steps of without") for reason in diff.not_comparable)
