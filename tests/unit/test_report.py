"""The offline HTML report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.report import render_report, write_report
from orchestrator.models.accelerator import Accelerator
from orchestrator.models.analysis import OpStat, PhaseTimes, RankSummary, Summary
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Artifact, Manifest, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.tracefiles import case


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


def _manifest(*keys: str, reason: str = "export failed") -> Manifest:
    artifacts = [Artifact(kind="merged_trace", key=k, uri=f"file:///p/{k}", bytes=12, sha256="0" * 64) for k in keys]
    return Manifest(
        profile_id="p-42",
        target="resnet",
        status=ProfileState.PARTIAL,
        request=ProfileRequest(target="resnet", steps=4),
        storage_uri="file:///p",
        start_step=121,
        stop_step=125,
        ranks=[RankResult(rank=0, state=RankState.DONE), RankResult(rank=1, state=RankState.FAILED, reason=reason)],
        artifacts=artifacts,
        requested_at=utcnow(),
        finished_at=utcnow(),
    )


def test_report_links_artifacts_from_manifest() -> None:
    html = render_report(analyze_folder(case("healthy")), _manifest("merged.trace.json.gz"))
    assert '<a href="./merged.trace.json.gz">merged.trace.json.gz</a>' in html
    assert "export failed" in html and "resnet / p-42" in html


@pytest.mark.parametrize("key", ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,x", "https:evil.example/x"])
def test_artifact_key_with_a_scheme_never_becomes_a_live_link(key: str) -> None:
    html = render_report(analyze_folder(case("healthy")), _manifest(key))

    hrefs = re.findall(r'href="([^"]*)"', html)
    assert hrefs and all(h.startswith("./") and ":" not in h for h in hrefs)


def test_artifact_links_are_escaped_and_stay_in_the_report_folder() -> None:
    html = render_report(analyze_folder(case("healthy")), _manifest('traces/a"><script>x</script>.json', "ops/r 1.csv"))

    assert "<script>" not in html
    assert 'href="./traces/a%22%3E%3Cscript%3Ex%3C/script%3E.json"' in html
    assert 'href="./ops/r%201.csv"' in html


def test_report_escapes_text_from_traces() -> None:
    rank = RankSummary(
        rank=0, host="<b>h</b>", file="f", device="cpu", steps=[], mean_step_ms=None, median_step_ms=None,
        mean_phases=PhaseTimes(), comm_wait_ms=0.0, top_ops=[OpStat(name="<script>x</script>", calls=1, total_ms=1.0)],
    )
    html = render_report(Summary(source="s", world_size=1, steps=[], ranks=[rank]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;h" in html


def test_the_rank_table_names_the_device_model_the_trace_names() -> None:
    rank = RankSummary(
        rank=0, host="h", file="f", device="cuda", steps=[], mean_step_ms=None, median_step_ms=None, mean_phases=PhaseTimes(),
        comm_wait_ms=0.0, accelerator=Accelerator(name="NVIDIA <H100>", runtime="cuda", capability=(9, 0)),
    )
    html = render_report(Summary(source="s", world_size=1, steps=[], ranks=[rank]))
    assert "<td class=l>NVIDIA &lt;H100&gt; (sm_90) (cuda)</td>" in html


@pytest.mark.parametrize(
    ("late", "waiting", "sentence"),
    [
        ([1], [], "rank 1 starts its steps up to 7.6 ms late, and no rank waits for it long enough to count"),
        ([1], [0], "rank 1 starts its steps up to 7.6 ms late and rank 0 waits for it"),
        ([2, 6, 7], [0, 1], "ranks 2, 6, 7 start their steps up to 7.6 ms late and ranks 0, 1 wait for them"),
        ([2, 6], [5], "ranks 2, 6 start their steps up to 7.6 ms late and rank 5 waits for them"),
    ],
)
def test_the_late_and_waiting_sentence_reads_right_for_every_count(late: list[int], waiting: list[int], sentence: str) -> None:
    # Issue 24: a 2-rank report said "ranks 1 start their steps up to 7.6 ms late and ranks none wait for them".
    summary = analyze_folder(case("straggler"))
    spread = summary.step_spread.model_copy(update={"late_ranks": late, "waiting_ranks": waiting, "arrival_spread_ms": 7.6})
    html = render_report(summary.model_copy(update={"step_spread": spread}))
    assert sentence in html and "ranks none" not in html
