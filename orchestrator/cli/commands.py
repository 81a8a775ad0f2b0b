"""The ``rayprof`` subcommands: each takes parsed arguments and returns an exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator.auth import check_exposure, is_loopback, read_token
from orchestrator.build import build_id
from orchestrator.cli.analyze_command import analyze_dir
from orchestrator.cli.output import emit_json, fail, out, print_manifest, print_stacks, print_status, table
from orchestrator.cli.progress import ProgressPrinter, current_steps_lookup
from orchestrator.cli.report_cache import fetched
from orchestrator.cli.terminal import printable
from orchestrator.client import ProfileHandle, ProfilingClient
from orchestrator.config import storage_spec
from orchestrator.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CleanupIncompleteError,
    ConfigurationError,
    InvalidRequestError,
)
from orchestrator.layout import STACKS_NAME
from orchestrator.models.common import Name
from orchestrator.models.control import TargetInfo, no_targets_note
from orchestrator.models.diagnosis import StacksBundle
from orchestrator.models.profile import ProfileStatus
from orchestrator.models.requests import ProfileState
from orchestrator.settings import (
    SERVE_APP_NAME,
)


def local_or_id(source: str) -> Path | str:
    """An ``ID|PATH`` argument (``report``, ``diff``): an existing file or folder, else a profile id. One that is
    neither is refused as what it most likely is, a path that is not there, before any service is asked."""
    path = Path(source)
    if path.exists():
        return path
    try:
        return TypeAdapter(Name).validate_python(source)
    except ValidationError:
        raise InvalidRequestError(
            f"{source!r}: no such file or folder, and not a profile id (letters, digits, '.', '_', '-', '=')"
        ) from None


def _client(args: argparse.Namespace) -> ProfilingClient:
    if args.in_cluster:
        return ProfilingClient.in_cluster(address=args.address)
    from orchestrator.client.http import HttpBackend

    return ProfilingClient(backend=HttpBackend(args.url, _token(args), s3_endpoint_url=args.s3_endpoint))


def _token(args: argparse.Namespace) -> str | None:
    # A token the user configured wrongly is theirs to fix: a usage error (exit 2).
    try:
        return read_token(args.token, args.token_file)
    except ConfigurationError as e:
        raise InvalidRequestError(e.message) from None


def _ray_auth_refusal(address: str) -> str | None:
    """Why the Ray cluster at ``address`` refuses this process's auth token, with the fix; None if it does not.

    Asked before ray.init(), which answers a refusal with 20 s of retry log and
    then "Failed to connect". Only explicit addresses (``--address``,
    ``RAY_ADDRESS``) are asked: with the default address Ray finds the local
    cluster and its token itself. GcsClient is the client `ray job submit` uses.
    """
    import os
    import socket

    from orchestrator.ray_compat import auth_errors, gcs_client

    refused = auth_errors()
    if not refused:
        return None  # a release without token auth: nothing to refuse
    explicit = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if not explicit or explicit == "auto" or "://" in explicit:
        return None
    host, _, port = explicit.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError):
        return None  # nothing listens there: ray.init() says so
    try:
        gcs_client(explicit)
        return None
    except refused:
        pass
    except Exception:
        return None  # not about auth: ray.init() reports it
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        why = "the Ray auth token this process sent is not the cluster's"
        fix = "put the cluster's token (`ray get-auth-token` on the head node prints it) in ~/.ray/auth_token or RAY_AUTH_TOKEN"
    else:
        why = "it uses Ray token auth, and RAY_AUTH_MODE is not 'token' here, so no token was sent"
        fix = (
            "export RAY_AUTH_MODE=token (Ray reads the token from ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or "
            "RAY_AUTH_TOKEN); or, on a node of the cluster, unset RAY_ADDRESS and leave out --address, so Ray "
            "finds the local cluster and its token itself"
        )
    return f"rayprof: the Ray cluster at {explicit} refused this process: {why}.\n  fix: {fix}"


def serve(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from actors.controller.upgrade import retire_other_build
    from orchestrator.ray_compat import auth_errors
    from orchestrator.service.app import build_app

    token = _token(args)
    try:
        check_exposure(args.host, token, insecure=args.insecure)
        # The storage is checked before the cluster is asked for: a bad flag is said first, whatever Ray does.
        if args.storage:
            storage_spec(args.storage, args.s3_endpoint, endpoint_from="--s3-endpoint")
    except ConfigurationError as e:
        return fail(args, EXIT_USAGE, e.code, e.message)
    if token is None and not is_loopback(args.host):
        print(f"rayprof: warning: serving on {args.host} without a token (--insecure)", file=sys.stderr)
    refusal = _ray_auth_refusal(args.address or "auto")
    if refusal:
        print(refusal, file=sys.stderr)
        return EXIT_FAILED
    try:
        ray.init(address=args.address or "auto", log_to_driver=False)
    except auth_errors() as e:
        print(f"rayprof: the Ray cluster needs its auth token: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ConnectionError as e:
        print(
            f"rayprof: no running Ray cluster to deploy onto ({e}); start one with `ray start --head`", file=sys.stderr
        )
        return EXIT_FAILED
    # Before deploying: a control actor left by another build is refused (nothing deployed) or replaced.
    if retire_other_build(replace=args.replace_controller):
        print("rayprof: replaced the control actor of another rayprof build", file=sys.stderr)
    serve.start(http_options={"host": args.host, "port": args.port})
    # After serve.start: the build checks the address Serve really binds.
    app = build_app(
        {
            "storage": args.storage,
            "s3_endpoint_url": args.s3_endpoint,
            "token": token,
            "insecure": args.insecure,
            # Without a token only these Host names are answered: loopback, and the address asked for.
            "allowed_hosts": [] if args.host in ("0.0.0.0", "::") else [args.host],
            # None (no flag): RAYPROF_MCP_READ_ONLY decides.
            "mcp_read_only": args.mcp_read_only,
        }
    )
    serve.run(app, name=SERVE_APP_NAME, route_prefix="/")
    url = f"http://{args.host}:{args.port}"
    # serve.start keeps the options of a Serve instance that was already running:
    # check that the service answers where we say it does.
    probe = f"http://127.0.0.1:{args.port}/healthz" if args.host in ("0.0.0.0", "::") else f"{url}/healthz"
    import httpx

    try:
        health = httpx.get(probe, timeout=10)
    except httpx.HTTPError as e:
        print(
            f"rayprof: deployed, but {probe} does not answer ({e}); Serve may already run with other "
            "http_options (see `serve status`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if not health.is_success:
        # The service runs but its control actor refuses (e.g. another live cluster holds the cluster name).
        return fail(args, EXIT_FAILED, "unhealthy", f"deployed, but {probe} answers {health.status_code}: {health.text}")
    if args.json:
        emit_json({"url": url, "docs": f"{url}/docs", "app": SERVE_APP_NAME})
    else:
        out(f"rayprof service: {url}  (API docs: {url}/docs; stop with `serve delete {SERVE_APP_NAME}`)")
    return EXIT_OK


def targets(args: argparse.Namespace) -> int:
    targets = _client(args).targets()
    if args.json:
        emit_json(targets)
        return EXIT_OK
    if (note := no_targets_note(len(targets))) is not None:
        out(note)
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
                t.health + (f" {t.stalled_s:.0f}s" if t.stalled_s is not None else ""),
                ", ".join(f"{r.info.world_rank} (-{r.steps_behind})" for r in t.ranks if r.info.world_rank in t.lagging_ranks)
                or "-",
                t.active_profile or "-",
            ]
        )
    out(table(rows, ["target", "ranks", "step", "step time", "health", "lagging (steps behind)", "active profile"]))
    for t in targets:
        # What one step is, as the agents learned it (their cycle of optimizer steps); ranks normally agree.
        definitions = sorted({r.step_definition for r in t.ranks if r.step_definition})
        if definitions:
            out(f"{t.name}: {' | '.join(definitions)}")
        if t.stall_stacks:
            out(f"{t.name}: stacks taken when it stalled: {t.stall_stacks} (rayprof report {t.stall_stacks})")
            if t.stall_verdict:
                out(f"{t.name}: they show: {t.stall_verdict}")
        if t.other_build_ranks:
            out(f"{t.name}: {_which_ranks(t.other_build_ranks, len(t.ranks))} another rayprof build than the controller {_outdated(t)}")
    return EXIT_OK


def _outdated(t: TargetInfo) -> str:
    """Which side outlived an upgrade: agents that run this rayprof's own build started after the controller did,
    and restarting their job would change nothing."""
    if {r.info.build for r in t.ranks if r.info.world_rank in t.other_build_ranks} == {build_id()}:
        return (
            "(they run this rayprof's build: the controller started before an upgrade): replace it with "
            "`rayprof serve --replace-controller` and the --storage it was first started with"
        )
    return "(the job started before an upgrade): restart the job to profile it with this build"


def _which_ranks(ranks: list[int], of: int, shown: int = 8) -> str:
    """'every rank's agent runs', or 'the agents of ranks 0, 1 and 3 more run': a line, however large the job."""
    if len(ranks) == of:
        return "every rank's agent runs"
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return f"the agents of ranks {', '.join(map(str, ranks[:shown]))}{more} run"


def _profile_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "record_shapes": args.record_shapes,
        "profile_memory": args.profile_memory,
        "with_stack": args.with_stack,
        "with_flops": args.with_flops,
        "with_modules": args.with_modules,
        "memory_snapshot": args.memory_snapshot,
        "warmup": args.warmup,
        "queue": args.queue,
    }
    if args.activities:
        options["activities"] = [a.strip() for a in args.activities.split(",") if a.strip()]
    if args.ranks is not None:
        try:
            options["ranks"] = [int(r) for r in args.ranks.split(",") if r.strip()]
        except ValueError:
            raise InvalidRequestError(f"--ranks {args.ranks!r}: expected comma-separated integers") from None
        if not options["ranks"]:
            raise InvalidRequestError("--ranks names no rank; leave it out to profile every rank")
    if args.window_timeout is not None:
        options["timeout_s"] = args.window_timeout
    return options


def profile(args: argparse.Namespace) -> int:
    client = _client(args)
    handle = client.profile(args.target, args.steps, idempotency_key=args.idempotency_key, **_profile_options(args))
    print(f"submitted {handle.id} on {handle.target}", file=sys.stderr)
    if not (args.wait or args.download):
        if args.json:
            emit_json(handle.last_status)
        else:
            out(handle.id)
        return EXIT_OK
    manifest = handle.wait(args.timeout, progress=ProgressPrinter(current_steps_lookup(client)))
    downloaded = handle.download(Path(args.download) / handle.id) if args.download else None
    if args.json:
        emit_json({"manifest": manifest, "downloaded_to": downloaded})
    else:
        print_manifest(manifest, downloaded)
    return EXIT_OK if manifest.status == ProfileState.DONE else EXIT_FAILED


def status(args: argparse.Namespace) -> int:
    return _show_status(args, _client(args).get(args.id).status())


def _show_status(args: argparse.Namespace, status: ProfileStatus) -> int:
    if args.json:
        emit_json(status)
    else:
        print_status(status)
    return EXIT_OK


def list_profiles(args: argparse.Namespace) -> int:
    page = _client(args).list(target=args.target, state=args.state, limit=args.limit, offset=args.offset)
    if args.json:
        emit_json(page)
        return EXIT_OK
    rows = [
        [p.id, p.target, p.state.value, str(p.steps) if p.steps is not None else "-", p.created_at.strftime("%Y-%m-%d %H:%M:%S")]
        for p in page.profiles
    ]
    out(table(rows, ["id", "target", "state", "steps", "created (UTC)"]) if rows else "no profiles")
    if page.total > page.offset + len(page.profiles):
        out(f"{len(page.profiles)} of {page.total}; next page: --offset {page.offset + len(page.profiles)}")
    return EXIT_OK


def gc(args: argparse.Namespace) -> int:
    report = _client(args).gc(dry_run=args.dry_run, grace_hours=args.grace_hours)
    if args.json:
        emit_json(report)
    else:
        verb = "would delete" if report.dry_run else "deleted"
        rows = [[p.id, p.target, p.state.value, "expired"] for p in report.expired]
        rows += [[x.profile_id, x.target, "-", "leftover (no manifest, no saved state)"] for x in report.leftovers]
        out(table(rows, ["id", "target", "state", "why"]) if rows else "nothing to delete")
        out(f"{verb} {len(report.expired)} expired profiles and {len(report.leftovers)} leftover folders")
        for why in report.skipped:
            out(why)
    if report.failed:
        raise CleanupIncompleteError(f"{len(report.failed)} could not be deleted: " + "; ".join(report.failed))
    return EXIT_OK


def delete(args: argparse.Namespace) -> int:
    client = _client(args)
    for profile_id in args.ids:
        client.delete(profile_id)
        out(f"deleted {profile_id}")
    return EXIT_OK


def cancel(args: argparse.Namespace) -> int:
    return _show_status(args, _client(args).get(args.id).cancel())


def download(args: argparse.Namespace) -> int:
    handle = _client(args).get(args.id)
    manifest = handle.manifest()
    downloaded = handle.download(Path(args.dir) / handle.id)
    if args.json:
        emit_json({"manifest": manifest, "downloaded_to": downloaded})
    else:
        print_manifest(manifest, downloaded)
    return EXIT_OK


def report(args: argparse.Namespace) -> int:
    source = local_or_id(args.source)
    if isinstance(source, Path):
        return analyze_dir(source, args)
    handle = _client(args).get(source)
    manifest = handle.manifest()
    folder = handle.download(Path(args.dest) / handle.id) if args.dest else fetched(handle)
    if manifest.kind == "stacks":
        return _stacks_report(handle, folder, args)
    # The manifest holds the post-window check as it stood when written; the status has its end.
    check = handle.last_status.post_window
    if check is not None:
        print(f"after the window: {check.verdict}: {check.detail}", file=sys.stderr)
    stored = next((a for a in manifest.artifacts if a.kind == "report"), None)
    if stored is not None:
        print(f"stored report: {printable(stored.uri)}", file=sys.stderr)
    # A report listed in the manifest was downloaded (and checksummed) as is; only
    # write one when the profile has none.
    return analyze_dir(folder, args, write=stored is None)


def _stacks_report(handle: ProfileHandle, folder: Path, args: argparse.Namespace) -> int:
    """A stored stacks bundle (downloaded into ``folder``), as `rayprof stacks` printed it when it was taken."""
    bundle = StacksBundle.model_validate_json((folder / STACKS_NAME).read_bytes())
    bundle = bundle.model_copy(update={"manifest_uri": handle.last_status.manifest_uri})
    if args.json:
        emit_json(bundle)
    else:
        print_stacks(bundle)
    return EXIT_OK


def demo(args: argparse.Namespace) -> int:
    from orchestrator.cli.demo import run_demo

    return run_demo(
        workdir=Path(args.dir), port=args.port, steps=args.steps, workers=args.workers, timeout_s=args.timeout
    )


