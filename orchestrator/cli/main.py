"""``rayprof``: argument parsing and the one place errors become exit statuses."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from orchestrator.build import build_id, release
from orchestrator.cli import analyze_command as analyze_cmd
from orchestrator.cli import commands as cmd
from orchestrator.cli import diff_command as diff_cmd
from orchestrator.cli import history_command as history_cmd
from orchestrator.cli import mcp_command as mcp_cmd
from orchestrator.cli import stacks_commands as stacks_cmd
from orchestrator.cli.output import fail, set_results
from orchestrator.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    RayprofError,
    validation_problems,
)
from orchestrator.models.requests import ProfileState
from orchestrator.settings import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_URL,
    GC_GRACE_HOURS_ENV_VAR,
    S3_ENDPOINT_URL_ENV_VAR,
    STORAGE_ENV_VAR,
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
    URL_ENV_VAR,
)

_DESCRIPTION = """\
Profile live Ray Train runs with torch.profiler.

Talks to the rayprof HTTP service (--url, default $RAYPROF_URL or
http://127.0.0.1:8000; bearer token from --token-file, $RAYPROF_TOKEN_FILE
or $RAYPROF_TOKEN) or, with --in-cluster, straight to the control actor of the
Ray cluster.
"""

_EPILOG = """\
exit status:
  0  success (a waited-for profile ended DONE)
  1  the profile ended PARTIAL, FAILED or CANCELLED, timed out, or the
     service or storage failed
  2  usage error or a request the service refused: bad arguments, unknown
     target or profile, a window already running (409), missing/wrong token

examples:
  rayprof serve --storage s3://traces/prof --s3-endpoint http://127.0.0.1:9000
  rayprof targets
  rayprof profile my-run --steps 5 --profile-memory --wait --download ./prof
  rayprof analyze ./prof/<profile-id>
"""


def _token_arguments(group: Any, what: str) -> None:
    # Neither option reads the environment here: orchestrator.auth.read_token does,
    # so an empty variable is an error rather than "no token".
    group.add_argument(
        "--token-file",
        default=None,
        help=f"{what}: a file holding it (default ${TOKEN_FILE_ENV_VAR}, else ${TOKEN_ENV_VAR})",
    )
    group.add_argument("--token", default=None, help=f"{what} itself (visible in `ps`: prefer --token-file)")


class _Version(argparse.Action):
    """``--version``: the release and the build id, computed only when asked (it reads the sources: ~25 ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"rayprof {release()} (build {build_id()})")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    connection = argparse.ArgumentParser(add_help=False)
    group = connection.add_argument_group("connection")
    group.add_argument(
        "--url",
        default=os.environ.get(URL_ENV_VAR) or DEFAULT_URL,
        help=f"service URL (default ${URL_ENV_VAR} or {DEFAULT_URL})",
    )
    _token_arguments(group, "bearer token")
    group.add_argument(
        "--in-cluster", action="store_true", help="talk to the control actor through Ray instead of HTTP"
    )
    group.add_argument("--address", default=None, help="Ray cluster address for --in-cluster (default: auto)")
    group.add_argument(
        "--s3-endpoint",
        default=os.environ.get(S3_ENDPOINT_URL_ENV_VAR) or None,
        help=f"S3 endpoint for downloads, e.g. MinIO (default ${S3_ENDPOINT_URL_ENV_VAR})",
    )
    group.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")

    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")

    parser = argparse.ArgumentParser(
        prog="rayprof", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="the release and build id (compared with the control actor's) and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str, parents: Sequence[Any]) -> Any:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            parents=list(parents),
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(handler=handler)
        return p

    p = command("serve", cmd.serve, "deploy the HTTP service onto the running Ray cluster and return", [output])
    p.add_argument(
        "--storage",
        default=os.environ.get(STORAGE_ENV_VAR) or None,
        help=f"where profiles go: a shared path or s3://bucket/prefix (default ${STORAGE_ENV_VAR})",
    )
    p.add_argument(
        "--s3-endpoint",
        default=os.environ.get(S3_ENDPOINT_URL_ENV_VAR) or None,
        help="S3-compatible endpoint, e.g. MinIO",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=stacks_cmd.PORT, default=8000)
    _token_arguments(p, "require this bearer token")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a non-loopback --host without a token (anyone who can reach it can profile)",
    )
    p.add_argument(
        "--mcp-read-only",
        action="store_true",
        default=None,
        help="/mcp leaves out the tools that act (profile, take_stacks, create_watch, delete_watch); "
        "default $RAYPROF_MCP_READ_ONLY",
    )
    p.add_argument(
        "--replace-controller",
        action="store_true",
        help="replace a control actor that runs another rayprof build (it outlives upgrades); the new one "
        "restores its state from storage, as after a restart",
    )
    p.add_argument("--address", default=None, help="Ray cluster address (default: auto)")

    command("targets", cmd.targets, "list live training runs and their ranks", [connection])

    p = command("profile", cmd.profile, "profile N optimizer steps of a live run", [connection])
    p.add_argument("target", help="Ray Train run name (RunConfig(name=...))")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to record on every rank")
    p.add_argument("--wait", action="store_true", help="wait for the end, showing per-rank progress on stderr")
    p.add_argument("--download", metavar="DIR", help="then download into DIR/<profile-id> (implies --wait)")
    p.add_argument("--timeout", type=stacks_cmd.finite_float, default=600.0, help="seconds to wait (default 600)")
    p.add_argument(
        "--window-timeout",
        type=stacks_cmd.finite_float,
        default=None,
        help="server side: give up on ranks that have not reported after this many seconds",
    )
    p.add_argument("--warmup", type=int, default=0, help="profiler warmup steps before the window")
    p.add_argument("--activities", help="cpu,cuda or cpu,xpu (default: cpu, plus the worker's GPU: cuda on NVIDIA and AMD, xpu on Intel)")
    p.add_argument("--ranks", help="comma-separated world ranks, e.g. 0,1 (default: all)")
    p.add_argument("--queue", action="store_true", help="wait behind a running window instead of failing")
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="retry-safe submit: run again with the same KEY and options and you get the first profile, "
        "not a second window (kept 24 h)",
    )
    for flag in ("record-shapes", "profile-memory", "with-stack", "with-flops", "with-modules"):
        p.add_argument(f"--{flag}", action="store_true", help=f"torch.profiler {flag.replace('-', '_')}=True")
    p.add_argument(
        "--memory-snapshot",
        action="store_true",
        help="record the CUDA caching allocator's history over the window and store each rank's snapshot "
        "(CUDA workers only)",
    )

    stacks_cmd.add_commands(command, [connection])
    history_cmd.add_command(command, [connection])
    mcp_cmd.add_command(command, [connection], release())

    p = command("status", cmd.status, "state and per-rank progress of a profile", [connection])
    p.add_argument("id")

    p = command("list", cmd.list_profiles, "profiles, newest first", [connection])
    p.add_argument("--target")
    p.add_argument("--state", choices=[s.value for s in ProfileState])
    p.add_argument("--limit", type=int, default=DEFAULT_PAGE_SIZE, help=f"profiles per page (default {DEFAULT_PAGE_SIZE})")
    p.add_argument("--offset", type=int, default=0, help="skip this many of the newest")

    p = command("delete", cmd.delete, "delete finished profiles: their files in storage and their records", [connection])
    p.add_argument("ids", nargs="+", metavar="ID")

    p = command(
        "gc",
        cmd.gc,
        "apply retention now and delete leftover folders (no manifest, no saved state) past a grace period",
        [connection],
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    p.add_argument(
        "--grace-hours",
        type=stacks_cmd.finite_float,
        default=None,
        help=f"keep leftovers younger than this (default ${GC_GRACE_HOURS_ENV_VAR} on the server, or 24)",
    )

    p = command("cancel", cmd.cancel, "cancel a profile", [connection])
    p.add_argument("id")

    p = command("download", cmd.download, "download a finished profile into DIR/<id>, verifying sha256", [connection])
    p.add_argument("id")
    p.add_argument("dir")

    p = command("analyze", analyze_cmd.analyze, "analyse a folder of traces (or one trace file) and write report.html", [output])
    p.add_argument("dir", help="a downloaded profile, any folder of *.pt.trace.json[.gz], or one trace file")
    p.add_argument(
        "--out", metavar="OUT", help="write report.html and merged.trace.json.gz here (created) instead of into DIR"
    )

    p = command("report", cmd.report, "report on a profile id (downloads it), a folder of traces or a trace file", [connection])
    p.add_argument("source", metavar="ID|PATH")
    p.add_argument(
        "--dest", help="where to download a profile id (default: the report cache, RAYPROF_CACHE_DIR; a profile in it is not fetched again)"
    )

    p = command("diff", diff_cmd.diff, "compare two profiles (ids or folders): what changed, and is it noise", [connection])
    diff_cmd.add_arguments(p)

    p = command("demo", cmd.demo, "local end-to-end demo: cluster, training job, service, one profile", [])
    p.add_argument("--dir", default="rayprof-demo", help="working folder (default ./rayprof-demo)")
    p.add_argument("--port", type=stacks_cmd.PORT, default=8000, help="service port (a free one if taken)")
    p.add_argument("--steps", type=stacks_cmd.int_in(1), default=5)
    p.add_argument("--workers", type=stacks_cmd.int_in(1), default=2)
    p.add_argument("--timeout", type=stacks_cmd.finite_float, default=600.0, help="give up after this many seconds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rayprof`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    results = sys.stdout
    previous = set_results(results)
    # `mcp` keeps sys.stdout: it is the protocol's channel (the SDK points fd 1 at stderr while serving).
    if args.command == "serve" or (getattr(args, "in_cluster", False) and args.command != "mcp"):
        sys.stdout = sys.stderr
    try:
        return args.handler(args)
    except ValidationError as e:
        return fail(args, EXIT_USAGE, "invalid_request", validation_problems(e.errors()))
    except RayprofError as e:
        return fail(args, e.exit_status, e.code, e.message)
    except KeyboardInterrupt:
        return fail(args, EXIT_FAILED, "interrupted", "interrupted")
    except BrokenPipeError:
        # The reader stopped reading (`rayprof report ID | head`): stop quietly, as a Unix tool does, and keep the
        # interpreter's final flush of stdout from raising it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    finally:
        sys.stdout = results
        set_results(previous)


