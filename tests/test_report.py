"""The offline HTML report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.models import OpStat, PhaseTimes, RankSummary, Summary
from orchestrator.analysis.report import render_report, write_report
from orchestrator.models import Artifact, Manifest, ProfileRequest, ProfileState, RankResult, RankState, utcnow
from tests.tracefiles import case


@pytest.fixture(scope="module")
def straggler_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("report") / "report.html"
    write_report(analyze_folder(case("straggler")), out)
    return out.read_text()


def test_report_is_self_contained(straggler_html: str) -> None:
    assert "<script" not in straggler_html and "<link" not in straggler_html
    # No fetched resources: the only URL is the SVG namespace identifier.
    assert set(re.findall(r"https?://[^\"' )]+", straggler_html)) == {"http://www.w3.org/2000/svg"}
    assert straggler_html.count("<svg") == 2  # phase bars and step-time chart


def test_report_names_findings_and_has_a_row_per_rank(straggler_html: str) -> None:
    assert "Rank 1 is a straggler (forward)" in straggler_html
    assert re.search(r"<tr><td>0</td><td class=l>vm</td>", straggler_html)
    assert re.search(r"<tr><td>1</td><td class=l>vm</td>", straggler_html)
    assert "<title>rank 1 forward:" in straggler_html  # a stacked phase segment


def test_healthy_report_says_no_findings(tmp_path: Path) -> None:
    html = write_report(analyze_folder(case("healthy")), tmp_path / "report.html").read_text()
    assert "No findings" in html


def test_report_lists_rejected_files(tmp_path: Path) -> None:
    html = render_report(analyze_folder(case("duplicate_rank")))
    assert "worker-b.pt.trace.json.gz (rank 1): duplicate rank 1" in html


def test_report_links_artifacts_from_manifest(tmp_path: Path) -> None:
    artifact = Artifact(kind="merged_trace", key="merged.trace.json.gz", uri="file:///p/merged.trace.json.gz", bytes=12, sha256="0" * 64)
    manifest = Manifest(
        profile_id="p-42",
        target="resnet",
        status=ProfileState.PARTIAL,
        request=ProfileRequest(target="resnet", steps=4),
        storage_uri="file:///p",
        start_step=121,
        stop_step=125,
        ranks=[RankResult(rank=0, state=RankState.DONE), RankResult(rank=1, state=RankState.FAILED, reason="export failed")],
        artifacts=[artifact],
        requested_at=utcnow(),
        finished_at=utcnow(),
    )
    html = render_report(analyze_folder(case("healthy")), manifest)
    assert '<a href="merged.trace.json.gz">merged.trace.json.gz</a>' in html
    assert "export failed" in html and "resnet / p-42" in html


def test_report_escapes_text_from_traces() -> None:
    rank = RankSummary(
        rank=0, host="<b>h</b>", file="f", device="cpu", steps=[], mean_step_ms=None, median_step_ms=None,
        mean_phases=PhaseTimes(), comm_wait_ms=0.0, top_ops=[OpStat(name="<script>x</script>", calls=1, total_ms=1.0)],
    )
    html = render_report(Summary(source="s", world_size=1, steps=[], ranks=[rank]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;h" in html
