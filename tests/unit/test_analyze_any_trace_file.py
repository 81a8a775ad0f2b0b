"""``rayprof analyze`` and ``rayprof diff`` take a trace as users have it: one file
(``prof.export_chrome_trace("trace.json")``), or a folder of traces not named ``*.pt.trace.json``; and a JSON file
that is not a trace is refused with its reason, never read as a rank that did nothing."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.cli.main import main
from orchestrator.traces.discover import discover_traces
from tests.support.tracefiles import case, shared

_TRACE = case("healthy") / "traces" / "rank0.vm.9327.pt.trace.json.gz"


def _export(folder: Path, name: str = "trace.json") -> Path:
    """A trace as export_chrome_trace writes it: plain JSON under a name the user chose."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(gzip.decompress(_TRACE.read_bytes()))
    return path


def test_one_trace_file_is_analysed_and_its_report_written_beside_it(tmp_path, capsys):
    trace = _export(tmp_path / "run")

    assert main(["analyze", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{trace}: 1 rank(s)") and "verdict: " in out
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["merged.trace.json.gz", "report.html", "trace.json"]


def test_a_folder_of_traces_not_named_pt_trace_json_is_read_and_says_so(tmp_path):
    # Before: "no *.pt.trace.json[.gz] files" and no verdict for the name every profiler tutorial writes.
    _export(tmp_path, "trace.json")
    (tmp_path / "config.json").write_text('{"lr": 0.1, "batch_size": 32}')

    summary = analyze_folder(tmp_path)
    assert [r.rank for r in summary.ranks] == [0] and summary.rejected == []
    assert "read as traces (not named *.pt.trace.json): trace.json" in summary.issues


def test_analysing_such_a_folder_again_does_not_read_its_own_merged_trace(tmp_path, capsys):
    _export(tmp_path)
    assert main(["analyze", str(tmp_path)]) == 0
    assert (tmp_path / "merged.trace.json.gz").is_file()

    assert main(["analyze", str(tmp_path)]) == 0
    assert "1 rank(s)" in capsys.readouterr().out
    assert [r.path.name for r in discover_traces(tmp_path).files] == ["trace.json"]


def test_a_folder_whose_json_files_are_not_traces_says_none_opens_like_one(tmp_path):
    (tmp_path / "config.json").write_text('{"lr": 0.1}')

    traces = discover_traces(tmp_path)
    assert traces.files == [] and traces.rejected == []
    assert traces.issues == [f"no *.pt.trace.json[.gz] files in {tmp_path}, and none of its 1 .json files opens like a Kineto trace"]


def test_a_json_object_without_trace_events_is_refused_not_read_as_a_rank_that_did_nothing(tmp_path, capsys):
    # Before: read as rank 0 with "no host spans", the verdict "No findings" and exit status 0.
    (tmp_path / "config.json").write_text('{"lr": 0.1, "batch_size": 32}')

    assert main(["analyze", str(tmp_path / "config.json")]) == 1
    printed = capsys.readouterr()
    assert "skipped config.json: unreadable trace: no traceEvents: not a Kineto trace (its keys: lr, batch_size)" in printed.out
    assert "No findings" not in printed.out and "no usable traces" in printed.err


def test_a_path_that_is_neither_file_nor_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}: no such file or folder" in capsys.readouterr().err


def test_a_lone_file_is_not_given_the_folders_manifest_or_memory(tmp_path, capsys):
    # A file is one rank: the profile folder around it (another profile's manifest) is not its own.
    shutil.copytree(case("healthy"), tmp_path / "prof")
    (tmp_path / "prof" / "manifest.json").write_text("not json: must not be read")
    trace = tmp_path / "prof" / "traces" / _TRACE.name

    assert main(["analyze", str(trace), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.html").is_file()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(content=st.binary(max_size=300), gz=st.booleans())
def test_any_json_named_file_in_a_folder_is_read_refused_or_left_with_a_note_never_a_crash(tmp_path, content, gz):
    folder = tmp_path / ("gz" if gz else "plain")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / ("x.json.gz" if gz else "x.json")).write_bytes(gzip.compress(content) if gz else content)

    summary = analyze_folder(folder)
    assert len(summary.ranks) + len(summary.rejected) <= 1
    assert summary.ranks or summary.rejected or any("opens like a Kineto trace" in i for i in summary.issues)


def test_two_trace_files_are_compared_like_two_folders(capsys):
    # The H100 recordings of a DataLoader-bound step before and after its fix, as the files a user has.
    before = shared("gpu-traces", "seed003_before", "rank0.pt.trace.json.gz")
    after = shared("gpu-traces", "seed003_after", "rank0.pt.trace.json.gz")

    assert main(["diff", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"A: {before}  (1 rank(s), steps [3, 4, 5, 6])")
    assert "step time shrank by 38.79 ms per step" in out and "phase data shrank" in out


def test_report_of_a_trace_file_analyses_it_without_asking_the_service(tmp_path, capsys):
    trace = _export(tmp_path / "run")

    assert main(["report", str(trace)]) == 0
    assert capsys.readouterr().out.startswith(f"{trace}: 1 rank(s)")
    assert (tmp_path / "run" / "report.html").is_file()
