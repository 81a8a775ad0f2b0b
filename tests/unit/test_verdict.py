"""The analysis in one line: the largest warning with what fixing it saves, or that nothing warns, said the same way
by ``rayprof analyze``/``report`` (the CLI), the HTML report and the MCP answer (an agent told only "findings: []"
has to infer "nothing to fix"; told nothing at all about info lines, it may chase one)."""

from __future__ import annotations

import pytest

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.analysis.finding_base import WARNING_FRACTION, verdict
from orchestrator.analysis.report import render_report
from orchestrator.cli.output import print_analysis
from orchestrator.mcp.convert import analysis_of
from orchestrator.mcp.resources import report_text
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.common import cli_results
from tests.support.realtraces import external, h100


def _manifest(summary: Summary) -> Manifest:
    return Manifest(
        profile_id="p-1", target="t", status=ProfileState.DONE, request=ProfileRequest(target="t", steps=3),
        storage_uri="file:///p", start_step=2, stop_step=5, ranks=[], artifacts=[], requested_at=utcnow(),
        finished_at=utcnow(), summary=summary,
    )


def _cli(summary: Summary) -> str:
    return cli_results(print_analysis, summary, None)[1]


def test_a_dataloader_bound_step_is_told_by_its_largest_warning_and_its_bound() -> None:
    # The H100 "before" recording: data loading takes 84% of a step; the idle device is the second warning.
    summary = h100("seed003_before")
    top = summary.findings[0]
    assert verdict(summary) == (
        f"2 warnings; the largest: Data loading takes 84% of the step: fixing it saves at most {top.max_saving_ms:.1f} "
        f"ms, {top.max_saving_fraction:.0%} of the step."
    )


def test_a_healthy_job_with_info_lines_is_told_nothing_warns_and_why() -> None:
    # The TensorBoard plugin's num_workers=4 ResNet-50 sample: healthy by the tutorial that made it; two info lines.
    line = verdict(external("tbplugin_resnet50_nw4_a"))
    assert line.startswith("No warning: 2 info lines, none worth a change on its own")
    assert f"at least {WARNING_FRACTION:.0%} of the step" in line


def test_no_findings_are_told_as_such() -> None:
    summary = external("tbplugin_resnet50_nw4_a").model_copy(update={"findings": []})
    assert verdict(summary) == "No findings: nothing in these steps crosses a threshold."


def test_a_folder_with_no_readable_trace_gets_no_verdict_of_health(tmp_path) -> None:
    # Before: "findings: none (nothing in these steps crosses a threshold)" for a folder whose one trace was cut short.
    (tmp_path / "rank0.pt.trace.json").write_text('{"traceEvents": [')
    summary = analyze_folder(tmp_path)
    assert summary.ranks == [] and summary.rejected
    assert verdict(summary) == "No verdict: no trace could be analysed."
    assert "No findings" not in _cli(summary) and "verdict: No verdict: no trace could be analysed." in _cli(summary)


@pytest.mark.parametrize("case", ["tbplugin_resnet50_nw4_a", "hta_trace_diff_control_a100_r3of8"])
def test_the_cli_the_report_and_the_mcp_answer_say_the_same_verdict(case: str) -> None:
    summary = external(case)
    line = verdict(summary)
    manifest = _manifest(summary)
    analysis = analysis_of(manifest)
    assert analysis is not None and analysis.verdict == line
    assert f"verdict: {line}" in report_text(manifest, analysis).splitlines()
    assert f"verdict: {line}" in _cli(summary).splitlines()
    html = render_report(summary)
    assert line.replace("'", "&#x27;") in html


def test_a_profile_whose_analysis_failed_says_so_in_its_verdict() -> None:
    manifest = _manifest(external("tbplugin_resnet50_nw4_a")).model_copy(
        update={"summary": None, "analysis_error": "rank 0's trace is not JSON"}
    )
    analysis = analysis_of(manifest)
    assert analysis is not None and analysis.verdict == "No analysis: rank 0's trace is not JSON"


def test_a_bound_measured_on_iterations_says_so() -> None:
    # PARAM's ResNet trace has no ProfilerStep: its bound is a share of an iteration, as its finding's title says.
    line = verdict(external("param_resnet_no_profilerstep"))
    assert line.endswith("of the iteration (no ProfilerStep).") and "of the step" not in line
