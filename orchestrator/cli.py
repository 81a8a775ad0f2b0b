"""The ``rayprof`` console script: profile live Ray Train runs from the shell."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

from orchestrator.client import ProfilingClient
from orchestrator.constants import (
    S3_ENDPOINT_URL_ENV_VAR,
    STORAGE_ENV_VAR,
    TOKEN_ENV_VAR,
)
from orchestrator.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RayprofError,
    UnauthorizedError,
)
from orchestrator.models import (
    Manifest,
    ProfileState,
    ProfileStatus,
    RankResult,
    RankState,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ProgressPrinter",
    "current_steps_lookup",
    "format_progress",
    "format_size",
    "main",
]

URL_ENV_VAR = "RAYPROF_URL"
DEFAULT_URL = "http://127.0.0.1:8000"
SERVE_APP_NAME = "rayprof"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_DESCRIPTION = """\
Profile live Ray Train runs with torch.profiler.

Talks to the rayprof HTTP service (--url, default $RAYPROF_URL or
http://127.0.0.1:8000; bearer token --token or $RAYPROF_TOKEN) or, with
--in-cluster, straight to the control actor of the Ray cluster.
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


class ProgressPrinter:
    """Prints one line per change while a profile runs: state, then per rank
    its state, steps captured and bytes uploaded.

    ``current_steps`` returns each rank's training step (from ``targets()``)
    to show progress inside the window; it is only asked while capturing.
    """

    def __init__(
        self, current_steps: Callable[[str], dict[int, int]] | None = None, stream: TextIO | None = None
    ) -> None:
        self._current_steps = current_steps
        self._stream = stream or sys.stderr
        self._started = time.monotonic()
        self._last = ""

    def __call__(self, status: ProfileStatus) -> None:
        steps_now: dict[int, int] = {}
        if self._current_steps is not None and status.state == ProfileState.CAPTURING:
            try:
                steps_now = self._current_steps(status.target)
            except RayprofError:
                steps_now = {}  # progress display only: never fail the wait for it
        line = format_progress(status, steps_now)
        if line != self._last:
            self._last = line
            print(f"[{time.monotonic() - self._started:6.1f}s] {line}", file=self._stream, flush=True)


def format_progress(status: ProfileStatus, steps_now: dict[int, int] | None = None) -> str:
    """``CAPTURING start step 120 | rank0 CAPTURING 2/5 steps 0 B | rank1 ...``."""
    head = status.state.value
    if status.start_step is not None:
        head += f" start step {status.start_step}"
    parts = [head]
    for rank in status.ranks:
        captured = _steps_captured(rank, status, (steps_now or {}).get(rank.rank))
        part = f"rank{rank.rank} {rank.state.value} {captured}/{_window_steps(status)} steps {format_size(rank.bytes_uploaded)}"
        if rank.reason and rank.state in (RankState.FAILED, RankState.CANCELLED):
            part += f" ({rank.reason})"
        parts.append(part)
    return " | ".join(parts)


def _window_steps(status: ProfileStatus) -> int:
    """Steps in the window as planned: fewer than asked when the byte cap shortened it."""
    if status.start_step is not None and status.stop_step is not None:
        return status.stop_step - status.start_step
    return status.request.steps


def _steps_captured(rank: RankResult, status: ProfileStatus, step_now: int | None) -> int:
    steps = _window_steps(status)
    if rank.first_step is not None and rank.last_step is not None:
        return rank.last_step - rank.first_step + 1
    if rank.state == RankState.UPLOADING:
        return steps
    if rank.state == RankState.CAPTURING and step_now is not None and status.start_step is not None:
        return max(0, min(steps, step_now - status.start_step))
    return 0


def format_size(n: int) -> str:
    """Bytes as B, KB, MB or GB."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def current_steps_lookup(client: ProfilingClient) -> Callable[[str], dict[int, int]]:
    """A lookup of each rank's current training step for :class:`ProgressPrinter`."""

    def lookup(target: str) -> dict[int, int]:
        for info in client.targets():
            if info.name == target:
                return {w.info.world_rank: w.step for w in info.ranks}
        return {}

    return lookup


# ---- output ---------------------------------------------------------------

# Where results go. Ray drivers print cluster warnings to sys.stdout from a
# background thread; commands that start one point sys.stdout at stderr so
# results (and --json) stay clean, and write here.
_results: TextIO = sys.stdout


def _out(*parts: object) -> None:
    print(*parts, file=_results, flush=True)


def _emit_json(value: Any) -> None:
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

    _out(json.dumps(plain(value), indent=2))


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _print_status(status: ProfileStatus) -> None:
    _out(
        f"{status.id}  target {status.target}  {status.state.value}" + (f"  ({status.reason})" if status.reason else "")
    )
    if status.start_step is not None:
        _out(f"steps {status.start_step}..{status.start_step + _window_steps(status) - 1}")
    if status.ranks:
        rows = [
            [
                str(r.rank),
                r.host or "",
                r.state.value,
                f"{_steps_captured(r, status, None)}/{_window_steps(status)}",
                format_size(r.bytes_uploaded),
                r.reason or "",
            ]
            for r in status.ranks
        ]
        _out(_table(rows, ["rank", "host", "state", "steps", "uploaded", "reason"]))
    if status.manifest_uri:
        _out(f"manifest: {status.manifest_uri}")


def _print_manifest(manifest: Manifest, downloaded: Path | None) -> None:
    _out(
        f"{manifest.profile_id}  target {manifest.target}  {manifest.status.value}"
        + (f"  ({manifest.reason})" if manifest.reason else "")
    )
    _out(f"steps {manifest.start_step}..{(manifest.stop_step or 1) - 1} on ranks {[r.rank for r in manifest.ranks]}")
    artifacts = manifest.all_artifacts()
    _out(
        f"{len(artifacts)} artifacts, {format_size(sum(a.bytes for a in artifacts))}, stored under {manifest.storage_uri}"
    )
    if downloaded is not None:
        _out(f"downloaded to {downloaded} (sha256 verified)")
        _out(f"view: tensorboard --logdir {downloaded / 'traces'}")


# ---- commands --------------------------------------------------------------


def _client(args: argparse.Namespace) -> ProfilingClient:
    if args.in_cluster:
        return ProfilingClient.in_cluster(address=args.address)
    from orchestrator.http_backend import HttpBackend

    return ProfilingClient(backend=HttpBackend(args.url, args.token, s3_endpoint_url=args.s3_endpoint))


def _cmd_serve(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from orchestrator.app import build_app

    token = args.token
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        print(
            f"rayprof: warning: serving on {args.host} without a token; anyone who can reach it can profile",
            file=sys.stderr,
        )
    try:
        ray.init(address=args.address or "auto", log_to_driver=False)
    except ConnectionError as e:
        print(
            f"rayprof: no running Ray cluster to deploy onto ({e}); start one with `ray start --head`", file=sys.stderr
        )
        return EXIT_FAILED
    app = build_app({"storage": args.storage, "s3_endpoint_url": args.s3_endpoint, "token": token})
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name=SERVE_APP_NAME, route_prefix="/")
    url = f"http://{args.host}:{args.port}"
    # serve.start keeps the options of a Serve instance that was already running:
    # check that the service answers where we say it does.
    probe = f"http://127.0.0.1:{args.port}/healthz" if args.host in ("0.0.0.0", "::") else f"{url}/healthz"
    import httpx

    try:
        httpx.get(probe, timeout=10).raise_for_status()
    except httpx.HTTPError as e:
        print(
            f"rayprof: deployed, but {probe} does not answer ({e}); Serve may already run with other "
            "http_options (see `serve status`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if args.json:
        _emit_json({"url": url, "docs": f"{url}/docs", "app": SERVE_APP_NAME})
    else:
        _out(f"rayprof service: {url}  (API docs: {url}/docs; stop with `serve delete {SERVE_APP_NAME}`)")
    return EXIT_OK


def _cmd_targets(args: argparse.Namespace) -> int:
    targets = _client(args).targets()
    if args.json:
        _emit_json(targets)
        return EXIT_OK
    if not targets:
        _out("no live training runs with rayprof agents")
        return EXIT_OK
    rows = []
    for t in targets:
        steps = [w.step for w in t.ranks]
        times = [w.step_time_s for w in t.ranks if w.step_time_s]
        rows.append(
            [
                t.name,
                f"{len(t.ranks)}/{t.world_size}",
                f"{min(steps)}..{max(steps)}" if steps else "-",
                f"{1000 * sum(times) / len(times):.0f} ms" if times else "-",
                t.active_profile or "-",
            ]
        )
    _out(_table(rows, ["target", "ranks", "step", "step time", "active profile"]))
    return EXIT_OK


def _profile_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "record_shapes": args.record_shapes,
        "profile_memory": args.profile_memory,
        "with_stack": args.with_stack,
        "with_flops": args.with_flops,
        "with_modules": args.with_modules,
        "warmup": args.warmup,
        "queue": args.queue,
    }
    if args.activities:
        options["activities"] = [a.strip() for a in args.activities.split(",") if a.strip()]
    if args.ranks:
        try:
            options["ranks"] = [int(r) for r in args.ranks.split(",") if r.strip()]
        except ValueError:
            raise InvalidRequestError(f"--ranks {args.ranks!r}: expected comma-separated integers") from None
    if args.window_timeout is not None:
        options["timeout_s"] = args.window_timeout
    return options


def _cmd_profile(args: argparse.Namespace) -> int:
    client = _client(args)
    handle = client.profile(args.target, args.steps, **_profile_options(args))
    print(f"submitted {handle.id} on {handle.target}", file=sys.stderr)
    if not (args.wait or args.download):
        if args.json:
            _emit_json(handle.last_status)
        else:
            _out(handle.id)
        return EXIT_OK
    manifest = handle.wait(args.timeout, progress=ProgressPrinter(current_steps_lookup(client)))
    downloaded = handle.download(Path(args.download) / manifest.profile_id) if args.download else None
    if args.json:
        _emit_json({"manifest": manifest, "downloaded_to": downloaded})
    else:
        _print_manifest(manifest, downloaded)
    return EXIT_OK if manifest.status == ProfileState.DONE else EXIT_FAILED


def _cmd_status(args: argparse.Namespace) -> int:
    return _show_status(args, _client(args).get(args.id).status())


def _show_status(args: argparse.Namespace, status: ProfileStatus) -> int:
    if args.json:
        _emit_json(status)
    else:
        _print_status(status)
    return EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    profiles = _client(args).list(target=args.target, state=args.state)
    if args.json:
        _emit_json(profiles)
        return EXIT_OK
    rows = [
        [p.id, p.target, p.state.value, str(p.request.steps), p.created_at.strftime("%Y-%m-%d %H:%M:%S")]
        for p in profiles
    ]
    _out(_table(rows, ["id", "target", "state", "steps", "created (UTC)"]) if rows else "no profiles")
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    return _show_status(args, _client(args).get(args.id).cancel())


def _cmd_download(args: argparse.Namespace) -> int:
    handle = _client(args).get(args.id)
    manifest = handle.manifest()
    downloaded = handle.download(Path(args.dir) / manifest.profile_id)
    if args.json:
        _emit_json({"manifest": manifest, "downloaded_to": downloaded})
    else:
        _print_manifest(manifest, downloaded)
    return EXIT_OK


def _print_analysis(summary: Any, report: Path | None) -> None:
    from orchestrator.analysis_models import PHASES

    _out(f"{summary.source}: {len(summary.ranks)} rank(s), steps {summary.steps[:1] + summary.steps[-1:]}")
    rows = [
        [str(r.rank), r.host or "", f"{r.median_step_ms:.1f}" if r.median_step_ms is not None else "-"]
        + [f"{r.mean_phases.get(p):.1f}" for p in PHASES]
        for r in summary.ranks
    ]
    if rows:
        _out(_table(rows, ["rank", "host", "step ms", *(f"{p} ms" for p in PHASES)]))
    for rejected in summary.rejected:
        _out(f"skipped {rejected.path.name}: {rejected.reason}")
    for issue in summary.issues:
        _out(f"note: {issue}")
    if not summary.findings:
        _out("findings: none (nothing in these steps crosses a threshold)")
    for finding in summary.findings:
        _out(
            f"\n[{finding.severity}] {finding.title} (ranks {finding.ranks})\n  {finding.evidence}\n  fix: {finding.fix}"
        )
    if report is not None:
        _out(f"\nreport: {report}")


def _analyze(folder: Path, args: argparse.Namespace, *, write: bool = True) -> int:
    """Analyse a folder of traces; writes ``report.html`` into it when ``write``."""
    from orchestrator.analysis import analyze_folder
    from orchestrator.report import write_report

    if not folder.is_dir():
        raise InvalidRequestError(f"{folder} is not a folder")
    summary = analyze_folder(folder)
    manifest_path = folder / "manifest.json"
    manifest = Manifest.model_validate_json(manifest_path.read_text()) if manifest_path.is_file() else None
    report = write_report(summary, folder / "report.html", manifest) if write and summary.ranks else None
    if args.json:
        _emit_json({"summary": summary, "report": report})
    else:
        _print_analysis(summary, report if report is not None else _existing_report(folder))
    if not summary.ranks:
        print(f"rayprof: no usable traces under {folder}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _existing_report(folder: Path) -> Path | None:
    path = folder / "report.html"
    return path if path.is_file() else None


def _cmd_analyze(args: argparse.Namespace) -> int:
    return _analyze(Path(args.dir), args)


def _cmd_report(args: argparse.Namespace) -> int:
    if Path(args.source).is_dir():
        return _analyze(Path(args.source), args)
    handle = _client(args).get(args.source)
    manifest = handle.manifest()
    dest = Path(args.dest) if args.dest else Path(tempfile.mkdtemp(prefix="rayprof-"))
    folder = handle.download(dest / manifest.profile_id)
    stored = next((a for a in manifest.artifacts if a.kind == "report"), None)
    if stored is not None:
        print(f"stored report: {stored.uri}", file=sys.stderr)
    # A report listed in the manifest was downloaded (and checksummed) as is; only
    # write one when the profile has none.
    return _analyze(folder, args, write=stored is None)


def _cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.demo import run_demo

    return run_demo(
        workdir=Path(args.dir), port=args.port, steps=args.steps, workers=args.workers, timeout_s=args.timeout
    )


# ---- parser ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    connection = argparse.ArgumentParser(add_help=False)
    group = connection.add_argument_group("connection")
    group.add_argument(
        "--url",
        default=os.environ.get(URL_ENV_VAR) or DEFAULT_URL,
        help=f"service URL (default ${URL_ENV_VAR} or {DEFAULT_URL})",
    )
    group.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV_VAR) or None, help=f"bearer token (default ${TOKEN_ENV_VAR})"
    )
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

    p = command("serve", _cmd_serve, "deploy the HTTP service onto the running Ray cluster and return", [output])
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
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV_VAR) or None,
        help=f"require this bearer token (default ${TOKEN_ENV_VAR})",
    )
    p.add_argument("--address", default=None, help="Ray cluster address (default: auto)")

    command("targets", _cmd_targets, "list live training runs and their ranks", [connection])

    p = command("profile", _cmd_profile, "profile N optimizer steps of a live run", [connection])
    p.add_argument("target", help="Ray Train run name (RunConfig(name=...))")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to record on every rank")
    p.add_argument("--wait", action="store_true", help="wait for the end, showing per-rank progress on stderr")
    p.add_argument("--download", metavar="DIR", help="then download into DIR/<profile-id> (implies --wait)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    p.add_argument(
        "--window-timeout",
        type=float,
        default=None,
        help="server side: give up on ranks that have not reported after this many seconds",
    )
    p.add_argument("--warmup", type=int, default=0, help="profiler warmup steps before the window")
    p.add_argument("--activities", help="cpu,cuda (default: cpu, plus cuda on GPU workers)")
    p.add_argument("--ranks", help="comma-separated world ranks, e.g. 0,1 (default: all)")
    p.add_argument("--queue", action="store_true", help="wait behind a running window instead of failing")
    for flag in ("record-shapes", "profile-memory", "with-stack", "with-flops", "with-modules"):
        p.add_argument(f"--{flag}", action="store_true", help=f"torch.profiler {flag.replace('-', '_')}=True")

    p = command("status", _cmd_status, "state and per-rank progress of a profile", [connection])
    p.add_argument("id")

    p = command("list", _cmd_list, "profiles, newest first", [connection])
    p.add_argument("--target")
    p.add_argument("--state", choices=[s.value for s in ProfileState])

    p = command("cancel", _cmd_cancel, "cancel a profile", [connection])
    p.add_argument("id")

    p = command("download", _cmd_download, "download a finished profile into DIR/<id>, verifying sha256", [connection])
    p.add_argument("id")
    p.add_argument("dir")

    p = command("analyze", _cmd_analyze, "analyse a folder of traces and write DIR/report.html", [output])
    p.add_argument("dir", help="a downloaded profile or any folder of *.pt.trace.json[.gz]")

    p = command("report", _cmd_report, "report on a profile id (downloads it) or a folder of traces", [connection])
    p.add_argument("source", metavar="ID|DIR")
    p.add_argument("--dest", help="where to download a profile id (default: a new temp folder)")

    p = command("demo", _cmd_demo, "local end-to-end demo: cluster, training job, service, one profile", [])
    p.add_argument("--dir", default="rayprof-demo", help="working folder (default ./rayprof-demo)")
    p.add_argument("--port", type=int, default=8000, help="service port (a free one if taken)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rayprof`` console script; returns the exit status."""
    global _results
    args = _parser().parse_args(argv)
    _results = sys.stdout
    if args.command == "serve" or getattr(args, "in_cluster", False):
        sys.stdout = sys.stderr
    try:
        return args.handler(args)
    except ValidationError as e:
        return _fail(args, EXIT_USAGE, "invalid_request", str(e))
    except RayprofError as e:

        usage = isinstance(e, (InvalidRequestError, NotFoundError, ConflictError, UnauthorizedError))
        return _fail(args, EXIT_USAGE if usage else EXIT_FAILED, e.code, e.message)
    except KeyboardInterrupt:
        return _fail(args, EXIT_FAILED, "interrupted", "interrupted")
    finally:
        sys.stdout = _results


def _fail(args: argparse.Namespace, status: int, code: str, detail: str) -> int:
    if getattr(args, "json", False):
        _emit_json({"error": code, "detail": detail})
    print(f"rayprof: {code}: {detail}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
