"""What commands print: results on stdout (or --json), errors on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel

from orchestrator.cli.progress import format_size, steps_captured, window_steps
from orchestrator.cli.terminal import printable, printable_lines
from orchestrator.models.analysis import Summary
from orchestrator.models.diagnosis import StacksBundle
from orchestrator.models.profile import Manifest, ProfileStatus

# Frames of each stacks group shown on the terminal; the stored rank files hold every frame.
_FRAMES_SHOWN = 8

__all__ = [
    "emit_json",
    "fail",
    "out",
    "print_analysis",
    "print_manifest",
    "print_status",
    "set_results",
    "table",
]

# Where results go. Ray drivers print cluster warnings to sys.stdout from a
# background thread; commands that start one point sys.stdout at stderr so
# results (and --json) stay clean, and write here.
_results: TextIO = sys.stdout


def out(*parts: object) -> None:
    """Print a result line; control characters from traces or the service are shown escaped."""
    print(printable_lines(" ".join(str(p) for p in parts)), file=_results, flush=True)


def emit_json(value: Any) -> None:
    def plain(v: Any) -> Any:
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json")
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, Path):
            return str(v)
        return v

    out(json.dumps(plain(value), indent=2))


def table(rows: list[list[str]], header: list[str]) -> str:
    cells = [[printable(c) for c in r] for r in [header, *rows]]
    widths = [max(len(c) for c in col) for col in zip(*cells)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def print_status(status: ProfileStatus) -> None:
    out(
        f"{status.id}  target {status.target}  {status.state.value}"
        + (f"  ({printable(status.reason)})" if status.reason else "")
    )
    if status.start_step is not None:
        out(f"steps {status.start_step}..{status.start_step + window_steps(status) - 1}")
    bundle = status.kind == "stacks"  # no window: no steps to count
    if status.ranks:
        rows = [
            [str(r.rank), r.host or "", r.state.value]
            + ([] if bundle else [f"{steps_captured(r, status, None)}/{window_steps(status)}"])
            + [format_size(r.bytes_uploaded), r.reason or ""]
            for r in status.ranks
        ]
        out(table(rows, ["rank", "host", "state"] + ([] if bundle else ["steps"]) + ["uploaded", "reason"]))
    if status.post_window is not None:
        out(f"after the window: {status.post_window.verdict}: {status.post_window.detail}")
    if status.manifest_uri:
        out(f"manifest: {printable(status.manifest_uri)}")
        if bundle:
            out(f"stacks: rayprof report {status.id}")


def print_manifest(manifest: Manifest, downloaded: Path | None) -> None:
    out(
        f"{manifest.profile_id}  target {manifest.target}  {manifest.status.value}"
        + (f"  ({printable(manifest.reason)})" if manifest.reason else "")
    )
    out(f"steps {manifest.start_step}..{(manifest.stop_step or 1) - 1} on ranks {[r.rank for r in manifest.ranks]}")
    artifacts = manifest.all_artifacts()
    out(
        f"{len(artifacts)} artifacts, {format_size(sum(a.bytes for a in artifacts))}, "
        f"stored under {printable(manifest.storage_uri)}"
    )
    if downloaded is not None:
        out(f"downloaded to {downloaded} (sha256 verified)")
        out(f"view: tensorboard --logdir {downloaded / 'traces'}")
    # What the window found, in the one line the report opens with: a waited profile ends with its answer.
    if isinstance(manifest.summary, Summary):
        from orchestrator.analysis.finding_base import verdict

        out(f"verdict: {printable(verdict(manifest.summary))}")
        out(f"findings, phases per rank: rayprof report {manifest.profile_id}")
    elif manifest.analysis_error:
        out(f"no analysis: {printable(manifest.analysis_error)}")


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def print_analysis(summary: Any, report: Path | str | None, manifest: Manifest | None = None) -> None:
    from orchestrator.analysis.finding_base import verdict
    from orchestrator.analysis.step_content import one_step
    from orchestrator.models.analysis import PHASES

    out(f"{printable(summary.source)}: {len(summary.ranks)} rank(s), steps {summary.steps[:1] + summary.steps[-1:]}")
    if (step := one_step(summary, manifest)) is not None:
        out(printable(step))
    # The phases are means per step, so the step beside them is the mean (they add up to it); the
    # median says whether a few slow steps make that mean.
    rows = [
        [str(r.rank), r.host or "", _ms(r.mean_step_ms), _ms(r.median_step_ms)]
        + [f"{r.mean_phases.get(p):.1f}" for p in PHASES]
        for r in summary.ranks
    ]
    if rows:
        out(table(rows, ["rank", "host", "mean step ms", "median", *(f"{p} ms" for p in PHASES)]))
    for r in summary.ranks:
        if r.idle is not None and r.idle.causes:
            causes = ", ".join(f"{c.cause} {c.ms_per_step:.1f}" for c in r.idle.causes[:4])
            out(f"rank {r.rank}: device idle {r.idle.idle_ms_per_step:.1f} ms per step ({causes})")
    for rejected in summary.rejected:
        out(f"skipped {printable(rejected.path.name)}: {printable(rejected.reason)}")
    if summary.caution is not None:
        out(f"caution: {printable(summary.caution)}")
    for issue in summary.issues:
        out(f"note: {printable(issue)}")
    out(f"verdict: {verdict(summary)}")
    for finding in summary.findings:
        title, evidence, fix = printable(finding.title), printable(finding.evidence), printable(finding.fix)
        out(f"\n[{finding.severity}] {title} (ranks {finding.ranks})\n  {evidence}\n  fix: {fix}")
    if report is not None:
        out(f"\nreport: {report}")



def fail(args: argparse.Namespace, status: int, code: str, detail: str) -> int:
    if getattr(args, "json", False):
        emit_json({"error": code, "detail": detail})
    print(f"rayprof: {printable(code)}: {printable(detail)}", file=sys.stderr)
    return status


def set_results(stream: TextIO) -> TextIO:
    """Send results to ``stream``; returns where they went before."""
    global _results
    previous, _results = _results, stream
    return previous


def print_stacks(bundle: StacksBundle) -> None:
    out(f"{bundle.id}  target {bundle.target}  {bundle.state.value}")
    out(bundle.summary)
    for group in bundle.groups:
        out(f"\n{group.ranks_text}{'' if group.majority or len(bundle.groups) == 1 else '  (differs from the majority)'}:")
        if group.activity:
            out(f"  {group.activity}")
        shown = group.frames[-_FRAMES_SHOWN:]
        if len(group.frames) > len(shown):
            out(f"  ... {len(group.frames) - len(shown)} outer frames")
        for f in shown:
            out(f'  File "{f.filename}", line {f.line}, in {f.function}')
            if f.code:
                out(f"    {f.code}")
    for m in bundle.missing:
        out(f"\nrank {m.rank} did not answer: {m.reason}")
    for t in bundle.truncated:
        out(f"\nrank {t.rank}: {t.note}")
    if bundle.collectives:
        out("\ncollectives (torch flight recorder):")
        for note in bundle.collectives:
            out(f"  {note}")
    elif bundle.flight_recorder_note:
        out(f"\ncollectives: not available ({bundle.flight_recorder_note})")
    for note in bundle.native_notes:
        out(f"note: {note}")
    if bundle.manifest_uri:
        out(f"\nstored: {bundle.manifest_uri}")
