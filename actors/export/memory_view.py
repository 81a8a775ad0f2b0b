"""A CUDA memory snapshot as one self-contained HTML page, in a child process.

Run as ``python -m actors.export.memory_view SNAPSHOT.pickle OUT.html TITLE``. torch's own
``torch.cuda._memory_viz.trace_plot`` writes a page that imports its viewer from a CDN
(``cdn.jsdelivr.net``), which a cluster without internet, or a strict content security
policy, cannot load. This page needs nothing: an inline SVG of the bytes allocated over
the recorded events, the peak, the largest blocks live at the peak with the Python frame
that allocated them, and every out-of-memory event. The pickle stays beside it for
torch's full viewer (pytorch.org/memory_viz reads it in the browser, offline once loaded).

Standard library only, like the exporter: the child starts fast and never imports torch.
The pickle is the one the parent process wrote a moment earlier from
``torch.cuda.memory._snapshot()``; this module never reads one from storage.
"""

from __future__ import annotations

import html
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DeviceMemory", "main", "read_device", "render"]

# Points of the SVG line: the peak of each bucket is kept, so no spike is lost.
_MAX_POINTS = 1500
_TOP_BLOCKS = 12
_FRAMES_SHOWN = 12
_WIDTH, _HEIGHT = 960, 240


@dataclass
class Block:
    """One allocation live at the peak."""

    size: int
    frames: list[dict[str, Any]]


@dataclass
class DeviceMemory:
    """What one device's recorded history says."""

    device: int
    events: int
    baseline: int  # bytes allocated before recording began and still live at its end
    series: list[int] = field(default_factory=list)  # allocated bytes after each alloc/free
    peak: int = 0
    peak_index: int = 0
    at_peak: list[Block] = field(default_factory=list)
    ooms: list[dict[str, Any]] = field(default_factory=list)
    span_us: float = 0.0


def _live_bytes(segments: list[dict[str, Any]], device: int) -> int:
    return sum(
        b.get("size", 0)
        for s in segments
        if s.get("device") == device
        for b in s.get("blocks", [])
        if b.get("state") == "active_allocated"
    )


def read_device(snapshot: dict[str, Any], device: int) -> DeviceMemory:
    """Replay one device's alloc/free events into allocated bytes over time."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    net = 0
    for ev in events:
        if ev.get("action") == "alloc":
            net += ev.get("size", 0)
        elif ev.get("action") == "free_completed":
            net -= ev.get("size", 0)
    # Blocks freed during the recording but allocated before it make ``net`` negative.
    baseline = max(0, _live_bytes(snapshot.get("segments") or [], device) - net, -min(0, net))
    out = DeviceMemory(device=device, events=len(events), baseline=baseline, peak=baseline)
    live: dict[int, Block] = {}
    peak_live: dict[int, Block] = {}
    now = baseline
    times = [ev["time_us"] for ev in events if isinstance(ev.get("time_us"), int | float)]
    out.span_us = float(max(times) - min(times)) if times else 0.0
    for ev in events:
        action = ev.get("action")
        if action == "alloc":
            now += ev.get("size", 0)
            live[ev.get("addr", 0)] = Block(size=ev.get("size", 0), frames=ev.get("frames") or [])
        elif action == "free_completed":
            now -= ev.get("size", 0)
            live.pop(ev.get("addr", 0), None)
        elif action == "oom":
            out.ooms.append({"size": ev.get("size", 0), "device_free": ev.get("device_free", 0),
                             "frames": ev.get("frames") or []})
            continue
        else:
            continue
        out.series.append(now)
        if now > out.peak:
            out.peak, out.peak_index, peak_live = now, len(out.series) - 1, dict(live)
    out.at_peak = sorted(peak_live.values(), key=lambda b: -b.size)[:_TOP_BLOCKS]
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _svg(series: list[int], peak: int) -> str:
    if not series or peak <= 0:
        return "<p>No allocation was recorded.</p>"
    step = max(1, -(-len(series) // _MAX_POINTS))
    points = [max(series[i:i + step]) for i in range(0, len(series), step)]
    n = max(1, len(points) - 1)
    coords = " ".join(f"{_WIDTH * i / n:.1f},{_HEIGHT - _HEIGHT * v / peak:.1f}" for i, v in enumerate(points))
    return (
        f'<svg viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
        f'aria-label="allocated bytes over the recorded events">'
        f'<polyline fill="none" stroke="#3366cc" stroke-width="1.5" points="{coords}"/></svg>'
    )


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch itself: the user's line that allocated."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("??"):
            return f"{name}:{f.get('line', '?')} {f.get('name', '')}"
    return "(torch internals only)" if frames else "(no stack recorded)"


def _stack(frames: list[dict[str, Any]]) -> str:
    lines = [f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '')}" for f in frames[:_FRAMES_SHOWN]]
    return html.escape("\n".join(lines))


def _device_section(d: DeviceMemory) -> str:
    rows = "".join(
        f"<tr><td>{_mib(b.size)}</td><td>{html.escape(_where(b.frames))}</td>"
        f"<td><details><summary>stack</summary><pre>{_stack(b.frames)}</pre></details></td></tr>"
        for b in d.at_peak
    )
    ooms = "".join(
        f"<li>asked for {_mib(o['size'])} with {_mib(o['device_free'])} free on the device, at "
        f"{html.escape(_where(o['frames']))}</li>"
        for o in d.ooms
    )
    return (
        f"<h2>cuda:{d.device}</h2>"
        f"<p>{d.events} events over {d.span_us / 1000:,.1f} ms; allocated at the start {_mib(d.baseline)}, "
        f"peak {_mib(d.peak)}.</p>{_svg(d.series, d.peak)}"
        + (f"<h3>Out of memory</h3><ul>{ooms}</ul>" if ooms else "")
        + (f"<h3>Largest blocks live at the peak</h3><table><tr><th>size</th><th>allocated at</th>"
           f"<th></th></tr>{rows}</table>" if rows else "")
    )


def render(snapshot: dict[str, Any], title: str) -> str:
    """The page for every device that recorded events or holds memory."""
    traces = snapshot.get("device_traces") or []
    devices = [read_device(snapshot, i) for i in range(len(traces))]
    shown = [d for d in devices if d.events or d.baseline]
    body = "".join(_device_section(d) for d in shown) or "<p>No device recorded any allocation.</p>"
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>body{{font:14px system-ui,sans-serif;margin:1.5em}}"
        "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left}"
        "pre{font-size:12px}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{body}<p>The snapshot itself (.pickle, beside this page) opens in "
        "torch's full viewer at pytorch.org/memory_viz.</p></body></html>"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m actors.export.memory_view SNAPSHOT.pickle OUT.html TITLE", file=sys.stderr)
        return 2
    with open(args[0], "rb") as f:
        snapshot = pickle.load(f)  # written by the parent a moment ago (module docstring)
    Path(args[1]).write_text(render(snapshot, args[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
