"""``rayprof history``: a live run's step time per rank over time, as a table with a sparkline each."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.cli.commands import _client
from orchestrator.cli.output import emit_json, out, table
from orchestrator.cli.stacks_commands import parse_duration
from orchestrator.errors import EXIT_OK, InvalidRequestError
from orchestrator.models.history import RankSeries
from orchestrator.settings import DEFAULT_HISTORY_MAX_POINTS, DEFAULT_HISTORY_SPAN_S

__all__ = ["add_command", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"
_WIDTH = 40


def add_command(command: Callable[..., Any], parents: Sequence[Any]) -> None:
    p = command("history", history, "a live run's step time per rank over time (kept by the controller)", parents)
    p.add_argument("target", help="Ray Train run name")
    p.add_argument("--run", help="the Ray job of the run (default: the newest live one)")
    p.add_argument(
        "--span",
        type=parse_duration,
        default=DEFAULT_HISTORY_SPAN_S,
        help="how far back: 10m (1 s points), up to 2h (10 s), up to 24h (1 min); default 10m",
    )
    p.add_argument("--ranks", help="comma-separated world ranks (default: all)")
    p.add_argument(
        "--max-points",
        type=int,
        default=DEFAULT_HISTORY_MAX_POINTS,
        help="most points, every rank together; past it the slowest ranks are shown, per bucket (default %(default)s)",
    )


def sparkline(values: Sequence[float | None], top: float, width: int = _WIDTH) -> str:
    """``values`` (oldest first) in ``width`` bars, each the mean of its share, as tall as that mean is of ``top``;
    gaps stay blank. Every rank's bars share one scale from zero (``top``: the largest value of any rank): a rank
    twice as slow stands twice as tall, and a steady run's few percent of noise stays flat. Scaled to each rank's
    own low and high, a run steady at 74-76 ms drew bars from the lowest to the highest."""
    if not values:
        return ""
    per = max(1, -(-len(values) // width))
    bars = []
    for i in range(0, len(values), per):
        chunk = [v for v in values[i : i + per] if v is not None and math.isfinite(v)]
        if not chunk:
            bars.append(" ")
            continue
        share = statistics.fmean(chunk) / top if top > 0 else 0.0
        bars.append(_BARS[min(len(_BARS) - 1, max(0, round(share * (len(_BARS) - 1))))])
    return "".join(bars)


def _ms(value: float | None) -> str:
    return f"{value * 1000:.1f} ms" if value is not None else "-"


def _row(series: RankSeries, top: float) -> list[str]:
    times = [v for v in series.step_time_s if v is not None]
    return [
        str(series.rank),
        f"{series.step[0]}..{series.step[-1]}" if series.step else "-",
        _ms(statistics.median(times) if times else None),
        _ms(max(times) if times else None),
        _ms(times[-1] if times else None),
        sparkline(series.step_time_s, top),
    ]


def history(args: argparse.Namespace) -> int:
    ranks = None
    if args.ranks:
        try:
            ranks = [int(r) for r in args.ranks.split(",")]
        except ValueError:
            raise InvalidRequestError(f"--ranks {args.ranks!r}: give comma-separated integers, e.g. 0,1") from None
    found = _client(args).history(args.target, run=args.run, span_s=args.span, ranks=ranks, max_points=args.max_points)
    if args.json:
        emit_json(found)
        return EXIT_OK
    out(f"{found.target}  run {found.run}  last {found.span_s:g}s at {found.resolution_s:g}s per point")
    if found.downsampled and found.ranks_total is not None and len(found.ranks) < found.ranks_total:
        out(f"the {len(found.ranks)} slowest of {found.ranks_total} ranks (by median step time; --max-points for more)")
    top = max((v for s in found.ranks for v in s.step_time_s if v is not None and math.isfinite(v)), default=0.0)
    heading = f"step time (bars: 0 to {_ms(top)})"
    out(table([_row(s, top) for s in found.ranks], ["rank", "steps", "median", "max", "latest", heading]))
    return EXIT_OK
