"""What the CLI and the MCP report text print per rank: the mean step beside the mean phases it is made of.

The GAN case's steps are 199, 200 and 58 ms: its mean (152) and median (199) differ by a third,
so a table that put the median beside mean phases would not add up.
"""

from __future__ import annotations

import re

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.cli.output import print_analysis
from orchestrator.mcp.convert import analysis_of
from orchestrator.mcp.resources import report_text
from orchestrator.models.analysis import PHASES
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.common import cli_results
from tests.support.tracefiles import case


@pytest.fixture(scope="module")
def summary():
    found = analyze_folder(case("gan"))
    rank = found.ranks[0]
    assert rank.mean_step_ms is not None and rank.median_step_ms is not None
    assert abs(rank.mean_step_ms - rank.median_step_ms) > 0.2 * rank.mean_step_ms
    return found


def test_the_cli_tables_step_column_is_the_sum_of_its_phase_columns(summary) -> None:
    lines = cli_results(print_analysis, summary, None)[1].splitlines()
    header = next(line.split() for line in lines if line.startswith("rank"))
    row = next(line.split() for line in lines if line.startswith("0 "))
    # "mean step ms" and "<phase> ms" are several words: the row's cells are rank, host, mean, median, phases.
    assert header[:6] == ["rank", "host", "mean", "step", "ms", "median"]
    mean, median, phases = float(row[2]), float(row[3]), [float(cell) for cell in row[4:]]
    assert len(phases) == len(PHASES)
    assert mean == pytest.approx(sum(phases), abs=0.05 * len(PHASES))
    assert mean == pytest.approx(summary.ranks[0].mean_step_ms, abs=0.05)
    assert median == pytest.approx(summary.ranks[0].median_step_ms, abs=0.05)


def test_the_mcp_report_text_says_the_mean_step_its_mean_phases_add_up_to(summary) -> None:
    manifest = Manifest(
        profile_id="p-1", target="gan", status=ProfileState.DONE, request=ProfileRequest(target="gan", steps=3),
        storage_uri="file:///p", start_step=2, stop_step=5, ranks=[], artifacts=[], requested_at=utcnow(),
        finished_at=utcnow(), summary=summary,
    )
    text = report_text(manifest, analysis_of(manifest))
    line = next(line for line in text.splitlines() if line.startswith("rank 0:"))
    found = re.search(r"mean step ([\d.]+) ms \(median ([\d.]+) ms\); mean phases ms: ([^;]+);", line)
    assert found is not None, line
    phases = [float(part.split()[1]) for part in found.group(3).split(", ")]
    assert float(found.group(1)) == pytest.approx(sum(phases), abs=0.05 * len(phases))
    assert float(found.group(2)) == pytest.approx(summary.ranks[0].median_step_ms, abs=0.05)
