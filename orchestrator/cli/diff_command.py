"""``rayprof diff A B``: compare two profiles, each a profile id, a local folder or one trace file."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.analysis.diff import DiffInput, ProfileDiff, diff_profiles
from orchestrator.cli import commands
from orchestrator.cli.output import emit_json, out
from orchestrator.cli.report_cache import fetched
from orchestrator.errors import EXIT_OK

__all__ = ["add_arguments", "diff"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``diff`` command's own arguments."""
    parser.add_argument("a", metavar="A", help="the profile before the change: a profile id, a folder or a trace file")
    parser.add_argument("b", metavar="B", help="the profile after the change: a profile id, a folder or a trace file")
    parser.add_argument("--html", metavar="FILE", help="also write the comparison as an HTML page")


def _side(args: argparse.Namespace, label: str, source: Path | str) -> DiffInput:
    from orchestrator.analysis.diff_inputs import load_folder

    if isinstance(source, Path):
        return load_folder(source, label=label)
    # One side stored, one local: read the stored one from the report cache, as `report ID` does.
    return load_folder(fetched(commands._client(args).get(source)), label=label)


def _compute(args: argparse.Namespace) -> ProfileDiff:
    a, b = commands.local_or_id(args.a), commands.local_or_id(args.b)
    if isinstance(a, str) and isinstance(b, str):
        # Both stored: the service computes it, so the CLI needs no access to storage.
        return commands._client(args).diff(a, b)
    return diff_profiles(_side(args, args.a, a), _side(args, args.b, b))


def diff(args: argparse.Namespace) -> int:
    from orchestrator.analysis.report_diff import diff_lines, write_diff_report

    result = _compute(args)
    if args.html:
        write_diff_report(result, Path(args.html))
    if args.json:
        emit_json(result)
    else:
        for line in diff_lines(result):
            out(line)
        if args.html:
            out(f"report: {args.html}")
    return EXIT_OK
