"""``rayprof analyze DIR [--out OUT]``: the analysis of a folder it may not write to stands; what it writes goes to
OUT when asked, with links that still lead to DIR's files."""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.cli.main import main
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Artifact, Manifest
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.tracefiles import case


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "prof"
    shutil.copytree(case("healthy"), folder)
    return folder


def test_a_folder_it_cannot_write_to_keeps_its_analysis_and_says_how_to_write_elsewhere(tmp_path, capsys):
    # Before: a traceback (OSError from the merge's temp file) and no analysis, e.g. on a read-only mount. A
    # directory where the merged trace would go fails the write the same way, for root too.
    folder = _copy(tmp_path)
    (folder / "merged.trace.json.gz").mkdir()
    (folder / "merged.trace.json.gz" / "keep").write_text("x")

    assert main(["analyze", str(folder)]) == 1
    printed = capsys.readouterr()
    assert "verdict: " in printed.out and "rank  host" in printed.out
    assert f"could not be written into {folder}" in printed.err and "pass --out DIR" in printed.err
    assert "Traceback" not in printed.err
    assert not (folder / "report.html").exists()


def test_out_gets_the_report_and_the_merged_trace_and_the_folder_gets_nothing(tmp_path, capsys):
    folder = _copy(tmp_path)
    before = sorted(p.name for p in folder.rglob("*"))

    assert main(["analyze", str(folder), "--out", str(tmp_path / "out" / "here")]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "here").iterdir()) == ["merged.trace.json.gz", "report.html"]
    assert sorted(p.name for p in folder.rglob("*")) == before
    assert f"report: {tmp_path / 'out' / 'here' / 'report.html'}" in capsys.readouterr().out


def test_a_report_written_elsewhere_links_to_the_profiles_own_files(tmp_path):
    folder = _copy(tmp_path)
    trace = next(p for p in folder.rglob("*.pt.trace.json*"))
    key = trace.relative_to(folder).as_posix()
    manifest = Manifest(
        profile_id="p-1", target="t", status=ProfileState.DONE, request=ProfileRequest(target="t", steps=2),
        storage_uri=folder.as_uri(), start_step=1, stop_step=3, ranks=[], requested_at=utcnow(), finished_at=utcnow(),
        artifacts=[Artifact(kind="trace", key=key, uri=trace.as_uri(), bytes=trace.stat().st_size, sha256="0" * 64)],
    )
    (folder / "manifest.json").write_text(manifest.model_dump_json())

    assert main(["analyze", str(folder), "--out", str(tmp_path / "reports")]) == 0
    html = (tmp_path / "reports" / "report.html").read_text()
    assert f'href="../prof/{key}"' in html
    assert (tmp_path / "reports" / f"../prof/{key}").resolve() == trace.resolve()


def test_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    folder = _copy(tmp_path)
    (tmp_path / "taken").write_text("mine")

    assert main(["analyze", str(folder), "--out", str(tmp_path / "taken")]) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "taken").read_text() == "mine"


def test_diff_of_a_folder_whose_only_trace_is_cut_short_names_the_file_and_why(tmp_path, capsys):
    # Before: "no analysable rank trace (none found)" for a folder that held a trace, cut short.
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "rank0.pt.trace.json").write_text('{"traceEvents": [')

    assert main(["diff", str(tmp_path / "cut"), str(_copy(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "no analysable rank trace (rank0.pt.trace.json: unreadable trace: " in err and "truncated" in err


def test_a_path_that_is_not_there_is_said_so_not_called_an_invalid_profile_id(tmp_path, capsys):
    # Before: "invalid profile id './prof-a/': letters, digits, ..." for a folder typed wrong.
    missing = str(tmp_path / "prof-a")
    for argv in (["report", missing], ["diff", str(_copy(tmp_path)), missing], ["diff", missing, "prof-1"]):
        assert main([*argv, "--url", "http://127.0.0.1:1"]) == 2
        assert f"rayprof: invalid_request: {missing!r}: no such file or folder, and not a profile id" in capsys.readouterr().err
