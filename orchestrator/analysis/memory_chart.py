"""Each rank's memory timeline: downsampled for a browser, drawn as inline SVG for ``report.html``.

The report is served under a CSP with no script at all, so the chart is
drawn here, on the server, as a static ``<svg>`` polyline per device.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from html import escape
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["MEMORY_POINTS", "MemorySeries", "downsample", "load_timelines", "render_memory_section"]

MEMORY_POINTS = 2000
"""A timeline is cut to this many points per device before it is drawn or sent to a browser."""

_RANK_FILE = re.compile(r"^rank(\d+)\.memory_timeline\.json\.gz$")
_WIDTH, _HEIGHT, _PAD = 640, 140, 36
_MIB = 1024 * 1024
# A timeline is a few MB of numbers; a file far past that is not one of ours.
_MAX_FILE_BYTES = 64 * _MIB


class MemorySeries(BaseModel):
    """One device's memory over time, as the export child writes it."""

    model_config = ConfigDict(frozen=True)

    ts_us: list[float]
    allocated_bytes: list[float]
    reserved_bytes: list[float] = []
    peak_allocated_bytes: float | None = None


def downsample(series: MemorySeries, points: int = MEMORY_POINTS) -> MemorySeries:
    """Every n-th window's peak, so a spike survives the cut."""
    ts, alloc, reserved = series.ts_us, series.allocated_bytes, series.reserved_bytes
    n = min(len(ts), len(alloc))
    stride = max(1, -(-n // points))
    keep = [max(range(start, min(start + stride, n)), key=lambda i: alloc[i]) for start in range(0, n, stride)]
    return MemorySeries(
        ts_us=[ts[i] for i in keep],
        allocated_bytes=[alloc[i] for i in keep],
        reserved_bytes=[reserved[i] for i in keep] if len(reserved) == len(ts) else [],
        peak_allocated_bytes=series.peak_allocated_bytes
        if series.peak_allocated_bytes is not None
        else max(alloc[:n], default=0.0),
    )


def parse_timeline(data: bytes) -> dict[str, MemorySeries]:
    """A ``memory_timeline.json.gz`` -> device name -> series; raises ``ValueError`` on anything else."""
    try:
        body = json.loads(gzip.decompress(data))
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise ValueError(f"not a memory timeline: {e}") from e
    devices = body.get("devices") if isinstance(body, dict) else None
    if not isinstance(devices, dict):
        raise ValueError("not a memory timeline: no 'devices' object")
    try:
        return {str(name): MemorySeries.model_validate(series) for name, series in devices.items()}
    except ValidationError as e:
        raise ValueError(f"not a memory timeline: {e.error_count()} invalid field(s)") from e


def load_timelines(folder: Path) -> tuple[dict[int, dict[str, MemorySeries]], list[str]]:
    """Every ``rank{R}.memory_timeline.json.gz`` under ``folder``, downsampled, and a note per unreadable file."""
    timelines: dict[int, dict[str, MemorySeries]] = {}
    notes: list[str] = []
    for path in sorted(folder.rglob("rank*.memory_timeline.json.gz")):
        m = _RANK_FILE.match(path.name)
        if m is None:
            continue
        if path.stat().st_size > _MAX_FILE_BYTES:
            notes.append(f"{path.name}: {path.stat().st_size} bytes, over {_MAX_FILE_BYTES}; not drawn")
            continue
        try:
            timelines[int(m.group(1))] = {
                name: downsample(series) for name, series in parse_timeline(path.read_bytes()).items()
            }
        except ValueError as e:
            notes.append(f"{path.name}: {e}")
    return timelines, notes


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _polyline(ts: list[float], values: list[float], t0: float, t1: float, top: float) -> str:
    span_t, span_v = (t1 - t0) or 1.0, top or 1.0
    points = []
    for t, v in zip(ts, values, strict=False):
        if math.isfinite(t) and math.isfinite(v):
            x = _PAD + (t - t0) / span_t * (_WIDTH - 2 * _PAD)
            y = _HEIGHT - _PAD / 2 - v / span_v * (_HEIGHT - _PAD)
            points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)


def _chart(rank: int, device: str, series: MemorySeries) -> str:
    ts = _finite(series.ts_us)
    values = _finite(series.allocated_bytes) + _finite(series.reserved_bytes)
    if not ts or not values:
        return f"<p>rank {rank} on {escape(device)}: no samples</p>"
    t0, t1, top = min(ts), max(ts), max(values)
    peak = series.peak_allocated_bytes if series.peak_allocated_bytes is not None else max(values)
    label = f"memory of rank {rank} on {device}: peak {peak / _MIB:.1f} MiB allocated over {(t1 - t0) / 1000:.1f} ms"
    lines = [
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" '
        f'points="{_polyline(series.ts_us, series.allocated_bytes, t0, t1, top)}"><title>allocated</title></polyline>'
    ]
    if series.reserved_bytes:
        lines.append(
            f'<polyline fill="none" stroke="#ff7f0e" stroke-dasharray="4 2" stroke-width="1" '
            f'points="{_polyline(series.ts_us, series.reserved_bytes, t0, t1, top)}"><title>reserved</title></polyline>'
        )
    return (
        f'<figure><svg role="img" aria-label="{escape(label)}" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect x="0" y="0" width="{_WIDTH}" height="{_HEIGHT}" fill="#fafafa" stroke="#ddd"/>'
        f'<text x="4" y="12" font-size="10">{top / _MIB:.1f} MiB</text>'
        f'<text x="4" y="{_HEIGHT - 4}" font-size="10">0</text>'
        f'<text x="{_WIDTH - 4}" y="{_HEIGHT - 4}" font-size="10" text-anchor="end">{(t1 - t0) / 1000:.1f} ms</text>'
        + "".join(lines)
        + f"</svg><figcaption>{escape(label)}; blue allocated, dashed orange reserved</figcaption></figure>"
    )


def render_memory_section(timelines: dict[int, dict[str, MemorySeries]], notes: list[str] | None = None) -> str:
    """The report's memory section: one chart per rank and device; empty when nothing was recorded."""
    if not timelines and not notes:
        return ""
    charts = [_chart(rank, device, series) for rank in sorted(timelines) for device, series in timelines[rank].items()]
    problems = "".join(f"<li>{escape(n)}</li>" for n in notes or [])
    return (
        '<section id="memory"><h2>Memory timeline</h2>'
        "<p>Memory allocated and reserved by the profiler's allocator, per rank and device, over the window.</p>"
        + "".join(charts)
        + (f"<ul>{problems}</ul>" if problems else "")
        + "</section>"
    )
