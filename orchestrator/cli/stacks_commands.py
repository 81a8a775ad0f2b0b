"""``rayprof stacks`` and the watch commands (``watch``, ``watches``, ``unwatch``)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.cli.commands import _client
from orchestrator.cli.output import emit_json, out, print_stacks, table
from orchestrator.errors import EXIT_FAILED, EXIT_OK, InvalidRequestError
from orchestrator.models.diagnosis import WatchSpec, WatchStatus, duration_text
from orchestrator.models.requests import ProfileState

__all__ = ["add_commands", "finite_float", "parse_duration"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``30``, ``30s``, ``10m``, ``1h`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    seconds = float(m.group(1)) * _UNITS[m.group(2)] if m is not None else math.nan
    if not math.isfinite(seconds):  # 400 nines read as inf
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite duration like 30s, 10m or 1h")
    return seconds


def finite_float(text: str) -> float:
    """A number argument; inf, nan and 1e400 (read as inf) are usage errors, not a traceback later."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
    return value


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer argument from ``low`` (to ``high``): a port, a step count, a worker count."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"{value} is under {low}: give {low} or more")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


PORT = int_in(1, 65535)


_OOM_HELP = (
    "when a rank runs out of CUDA memory, every rank's stacks and CUDA allocator snapshot in one bundle "
    "(every rank records the allocator's history while the watch exists)"
)


def add_commands(command: Callable[..., Any], parents: Sequence[Any]) -> None:
    """Register the commands on the ``rayprof`` parser (``command`` is main's subparser factory)."""
    p = command("stacks", stacks, "every rank's stacks now, grouped; stored like a profile", parents)
    p.add_argument("target", help="Ray Train run name")
    p.add_argument("--native", action="store_true", help="add native frames through py-spy (rayprof[native])")
    p.add_argument("--run", metavar="JOB", help="the run (Ray job) when two live runs share the name (default the newest)")

    p = command(
        "watch", watch, "watch a target and profile (or take stacks) when it slows, lags or stalls, or on a schedule", parents
    )
    p.add_argument("target", help="Ray Train run name")
    cond = p.add_mutually_exclusive_group(required=True)
    cond.add_argument("--slower-than", type=finite_float, metavar="RATIO", help="median step time over the baseline, e.g. 1.3")
    cond.add_argument("--rank-lag", type=int, metavar="STEPS", help="a rank this many steps behind the leader")
    cond.add_argument("--stalled", action="store_true", help="no rank advanced (see RAYPROF_STALL_MIN_S)")
    cond.add_argument(
        "--every", type=parse_duration, metavar="DURATION", help="on a schedule: now, then this long after each firing"
    )
    cond.add_argument("--oom", action="store_true", help=_OOM_HELP)
    p.add_argument("--for", dest="for_s", type=parse_duration, default=30.0, help="how long it must hold (default 30s)")
    then = p.add_mutually_exclusive_group()
    then.add_argument("--then-profile", type=int, metavar="STEPS", help="then profile this many steps (default 5)")
    then.add_argument("--then-stacks", action="store_true", help="then take every rank's stacks (default with --stalled)")
    p.add_argument("--ranks", choices=["all", "lagging"], default="all", help="with --rank-lag: lagging ranks + 2 healthy")
    p.add_argument("--baseline", type=parse_duration, default=300.0, help="rolling baseline window (default 5m)")
    p.add_argument("--cooldown", type=parse_duration, default=600.0, help="quiet time after it fires (default 10m)")
    p.add_argument("--max-per-hour", type=int, default=4, help="most firings in any hour (default 4)")

    p = command("oom-watch", oom_watch, "the same as watch TARGET --oom: " + _OOM_HELP, parents)
    p.add_argument("target", help="Ray Train run name")
    p.add_argument("--cooldown", type=parse_duration, default=600.0, help="quiet time after it fires (default 10m)")
    p.add_argument("--max-per-hour", type=int, default=4, help="most firings in any hour (default 4)")

    command("watches", watches, "every watch, its state and firings", parents)

    p = command("unwatch", unwatch, "stop and forget watches", parents)
    p.add_argument("ids", nargs="+", metavar="ID")


def stacks(args: argparse.Namespace) -> int:
    bundle = _client(args).stacks(args.target, native=args.native, run=args.run)
    if args.json:
        emit_json(bundle)
    else:
        print_stacks(bundle)
    return EXIT_OK if bundle.state == ProfileState.DONE else EXIT_FAILED


def watch(args: argparse.Namespace) -> int:
    if args.ranks == "lagging" and args.rank_lag is None:
        raise InvalidRequestError("--ranks lagging needs --rank-lag")
    if args.oom and args.then_profile is not None:
        raise InvalidRequestError("--oom takes every rank's stacks and memory snapshots; leave out --then-profile")
    spec = WatchSpec(
        target=args.target,
        slower_than=args.slower_than,
        rank_lag=args.rank_lag,
        stalled=args.stalled,
        every_s=args.every,
        oom=args.oom,
        for_s=args.for_s,
        # A stalled run takes no steps to profile, nor does a rank out of memory: stacks is what can work.
        action="stacks" if args.then_stacks or ((args.stalled or args.oom) and args.then_profile is None) else "profile",
        profile_steps=5 if args.then_profile is None else args.then_profile,
        ranks=args.ranks,
        baseline_s=args.baseline,
        cooldown_s=args.cooldown,
        max_per_hour=args.max_per_hour,
    )
    return _create(args, spec)


def oom_watch(args: argparse.Namespace) -> int:
    spec = WatchSpec(
        target=args.target, oom=True, action="stacks", cooldown_s=args.cooldown, max_per_hour=args.max_per_hour
    )
    return _create(args, spec)


def _create(args: argparse.Namespace, spec: WatchSpec) -> int:
    status = _client(args).watch(spec.target, **spec.model_dump(exclude={"target"}))
    if args.json:
        emit_json(status)
    else:
        out(f"{status.id}  watching {spec.target}: {describe(spec)}")
    return EXIT_OK


def describe(spec: WatchSpec) -> str:
    """A watch in words."""
    if spec.oom:
        return (
            "when a rank runs out of CUDA memory (every rank records the allocator's history), take every rank's "
            f"stacks and memory snapshot; cooldown {spec.cooldown_s:g}s, at most {spec.max_per_hour}/hour"
        )
    if spec.slower_than is not None:
        cond = f"median step time over {spec.slower_than:g}x its {spec.baseline_s:g}s baseline"
    elif spec.rank_lag is not None:
        cond = f"a rank {spec.rank_lag}+ steps behind the leader"
    elif spec.stalled:
        cond = "no rank advancing (STALLED)"
    else:
        cond = None
    then = "take every rank's stacks" if spec.action == "stacks" else f"profile {spec.profile_steps} steps on {spec.ranks} ranks"
    when = f"every {duration_text(spec.every_s or 0)}" if cond is None else f"when {cond} for {spec.for_s:g}s"
    return f"{when}, {then}; cooldown {spec.cooldown_s:g}s, at most {spec.max_per_hour}/hour"


def watches(args: argparse.Namespace) -> int:
    found: list[WatchStatus] = _client(args).watches()
    if args.json:
        emit_json(found)
        return EXIT_OK
    if not found:
        out("no watches")
        return EXIT_OK
    rows = [
        [
            w.id,
            w.spec.target,
            w.state,
            f"{w.baseline * 1000:.0f} ms" if w.baseline is not None else "-",
            f"{w.observed:g}" if w.observed is not None else "-",
            str(len(w.firings)),
            (w.firings[-1].profile_id or w.firings[-1].error or "-") if w.firings else "-",
        ]
        for w in found
    ]
    out(table(rows, ["watch", "target", "state", "baseline", "observed", "fired", "last"]))
    for w in found:
        due = f"; next {w.next_at:%Y-%m-%d %H:%M:%S} UTC" if w.next_at is not None and w.paused is None else ""
        out(f"{w.id}: {describe(w.spec)}{due}" + (f" ({w.note})" if w.note else ""))
        if w.paused:
            out(f"{w.id} PAUSED: {w.paused}")
    return EXIT_OK


def unwatch(args: argparse.Namespace) -> int:
    client = _client(args)
    for watch_id in args.ids:
        client.delete_watch(watch_id)
        if not args.json:
            out(f"{watch_id} deleted")
    if args.json:
        emit_json({"deleted": args.ids})
    return EXIT_OK
