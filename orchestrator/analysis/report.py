"""Render a :class:`Summary` as one self-contained ``report.html``.

Works offline: inline CSS and SVG only, no scripts, no fonts or styles from a
CDN. Every value from a trace or manifest is HTML-escaped.
"""

from __future__ import annotations

import os
import tempfile
from html import escape
from pathlib import Path
from urllib.parse import quote

from orchestrator.analysis.finding_base import verdict
from orchestrator.analysis.step_content import one_step
from orchestrator.models.analysis import IDLE_CAUSES, IDLE_LABELS, PHASES, RankSummary, Summary
from orchestrator.models.profile import Manifest

__all__ = ["IDLE_COLORS", "PHASE_COLORS", "render_report", "write_report"]

PHASE_COLORS = {
    "data": "#e15759",
    "forward": "#4e79a7",
    "backward": "#76b7b2",
    "optimizer": "#59a14f",
    "comm": "#f28e2b",
    "memcpy": "#b07aa1",
    "sync": "#edc948",
    "other": "#bab0ac",
}
# Device idle causes in the phase bars' colours where a phase is the same wait; the rest get colours of their own.
IDLE_COLORS = {
    "busy": "#555555",
    "data": PHASE_COLORS["data"],
    "anomaly": "#f1ce63",
    "sync": PHASE_COLORS["sync"],
    "copy": PHASE_COLORS["memcpy"],
    "collective": PHASE_COLORS["comm"],
    "late_rank": "#9c755f",
    "capture": "#86bcb6",
    "compile": "#b6992d",
    "runtime": "#8cd17d",
    "cpu": "#ff9da7",
    "launch": "#d37295",
    "queued": "#d4a6c8",
    "untraced": PHASE_COLORS["other"],
}
_RANK_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child,td.l,th.l{text-align:left}
.finding{border-left:4px solid #e15759;padding:.4em .8em;margin:.8em 0;background:#fdf3f3}
.finding.info{border-color:#4e79a7;background:#f2f6fa}.finding p{margin:.3em 0}
.ok{color:#2d7a2d}.verdict{font-weight:600}.muted{color:#777}.legend span{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:.9em;height:.9em;vertical-align:-.1em;margin-right:.3em}
"""


def _ranks(ranks: list[int]) -> str:
    """``rank 1`` or ``ranks 0, 2, 3``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _findings(summary: Summary) -> str:
    warns = any(f.severity == "warning" for f in summary.findings)
    parts = [f'<p class="verdict">Caution: {escape(summary.caution)}</p>'] if summary.caution else []
    parts.append(f'<p class="{"verdict" if warns else "ok"}">{escape(verdict(summary))}</p>')
    for f in summary.findings:
        parts.append(
            f'<div class="finding {escape(f.severity)}"><strong>{escape(f.title)}</strong>'
            f' <span class="muted">({escape(f.severity)}, {escape(", ".join(f"rank {r}" for r in f.ranks))})</span>'
            f"<p>{escape(f.evidence)}</p><p><em>Fix:</em> {escape(f.fix)}</p></div>"
        )
    return "".join(parts)


def _rank_table(summary: Summary) -> str:
    head = "".join(f"<th>{p} ms</th>" for p in PHASES)
    rows = []
    for r in summary.ranks:
        util = f"{r.gpu.utilization:.0%}" if r.gpu else "–"
        cells = "".join(f"<td>{_ms(r.mean_phases.get(p))}</td>" for p in PHASES)
        device = f"{r.accelerator.label} ({r.device})" if r.accelerator else r.device
        rows.append(
            f"<tr><td>{r.rank}</td><td class=l>{escape(r.host or '?')}</td><td class=l>{escape(device)}</td><td>{len(r.steps)}</td>"
            f"<td>{_ms(r.mean_step_ms)}</td><td>{_ms(r.comm_wait_ms)}</td><td>{util}</td>{cells}</tr>"
        )
    return (
        "<table><tr><th>rank</th><th class=l>host</th><th class=l>device</th><th>steps</th><th>mean step ms</th>"
        f"<th>comm wait ms</th><th>GPU util</th>{head}</tr>{''.join(rows)}</table>"
    )


def _phase_bars(ranks: list[RankSummary]) -> str:
    """One horizontal bar per rank, segments proportional to mean phase time."""
    timed = [r for r in ranks if r.mean_step_ms]
    if not timed:
        return ""
    longest = max(r.mean_phases.total() for r in timed) or 1.0
    width, label, row = 900, 70, 26
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + label}" height="{row * len(timed) + 4}" role="img">']
    for i, r in enumerate(timed):
        y, x = i * row + 2, float(label)
        parts.append(f'<text x="0" y="{y + 16}" font-size="12">rank {r.rank}</text>')
        for p in PHASES:
            w = r.mean_phases.get(p) / longest * width
            if w > 0:
                parts.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="20" fill="{PHASE_COLORS[p]}">'
                    f"<title>rank {r.rank} {p}: {r.mean_phases.get(p):.2f} ms</title></rect>"
                )
                x += w
    parts.append("</svg>")
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>{p}</span>' for p, c in PHASE_COLORS.items())
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def _idle_bars(ranks: list[RankSummary]) -> str:
    """One bar per rank: the device's busy time, then its idle time split by cause, per step."""
    timed = [r for r in ranks if r.idle is not None and r.gpu is not None and r.mean_step_ms]
    if not timed:
        return ""
    longest = max(r.gpu.busy_ms_per_step + r.idle.idle_ms_per_step for r in timed) or 1.0
    width, label, row = 900, 70, 26
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + label}" height="{row * len(timed) + 4}" role="img">']
    for i, r in enumerate(timed):
        y, x = i * row + 2, float(label)
        parts.append(f'<text x="0" y="{y + 16}" font-size="12">rank {r.rank}</text>')
        segments = [("busy", "device busy", r.gpu.busy_ms_per_step)] + [(c.cause, c.label, c.ms_per_step) for c in r.idle.causes]
        for key, words, ms in segments:
            w = ms / longest * width
            if w > 0:
                parts.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="20" fill="{IDLE_COLORS[key]}">'
                    f"<title>rank {r.rank}: {escape(words)} {ms:.2f} ms per step</title></rect>"
                )
                x += w
    parts.append("</svg>")
    used = {c.cause for r in timed for c in r.idle.causes}
    legend = f'<span><i class="sw" style="background:{IDLE_COLORS["busy"]}"></i>device busy</span>' + "".join(
        f'<span><i class="sw" style="background:{IDLE_COLORS[c]}"></i>{escape(IDLE_LABELS[c])}</span>' for c in IDLE_CAUSES if c in used
    )
    return (
        "<h2>Why the device idles</h2><p class=muted>Per step: device busy time, then each idle gap blamed on what the "
        "launching host thread was doing (see rayprof's docs/results.md).</p>"
        f'<div class="legend">{legend}</div>' + "".join(parts)
    )


def _step_chart(ranks: list[RankSummary]) -> str:
    """Step time per step number, one line per rank."""
    points = [(s.step, s.duration_ms) for r in ranks for s in r.steps]
    if not points:
        return ""
    width, height, pad = 900, 220, 40
    steps = sorted({p[0] for p in points})
    top = max(p[1] for p in points) * 1.1 or 1.0
    span = max(steps[-1] - steps[0], 1)

    def xy(step: int, ms: float) -> tuple[float, float]:
        return pad + (step - steps[0]) / span * (width - 2 * pad), height - pad - ms / top * (height - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    parts.append(f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>')
    parts.append(f'<text x="2" y="{pad - 8}" font-size="11">{top:.0f} ms</text>')
    for s in steps:
        parts.append(f'<text x="{xy(s, 0)[0]:.1f}" y="{height - pad + 16}" font-size="11" text-anchor="middle">{s}</text>')
    for i, r in enumerate(ranks):
        color = _RANK_COLORS[i % len(_RANK_COLORS)]
        coords = [xy(s.step, s.duration_ms) for s in r.steps]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"><title>rank {r.rank}</title></polyline>')
        for s, (x, y) in zip(r.steps, coords):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>rank {r.rank} step {s.step}: {s.duration_ms:.1f} ms</title></circle>')
    parts.append("</svg>")
    legend = "".join(
        f'<span><i class="sw" style="background:{_RANK_COLORS[i % len(_RANK_COLORS)]}"></i>rank {r.rank}</span>' for i, r in enumerate(ranks)
    )
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def _top_ops(ranks: list[RankSummary]) -> str:
    parts = []
    for r in ranks:
        rows = "".join(f"<tr><td class=l>{escape(o.name)}</td><td>{o.calls}</td><td>{o.total_ms:.2f}</td></tr>" for o in r.top_ops)
        kernels = "".join(f"<tr><td class=l>{escape(o.name)}</td><td>{o.calls}</td><td>{o.total_ms:.2f}</td></tr>" for o in r.top_kernels)
        body = f"<table><tr><th class=l>operator (host self time)</th><th>calls</th><th>ms</th></tr>{rows}</table>"
        if kernels:
            body += f"<table><tr><th class=l>GPU kernel</th><th>calls</th><th>ms</th></tr>{kernels}</table>"
        parts.append(f"<details><summary>rank {r.rank}</summary>{body}</details>")
    return "".join(parts)


def _problems(summary: Summary) -> str:
    items = [f"<li>{escape(i)}</li>" for i in summary.issues]
    items += [
        f"<li>{escape(r.path.name)} (rank {r.rank if r.rank is not None else '?'}): {escape(r.reason)}</li>" for r in summary.rejected
    ]
    return f"<h2>Problems with the input</h2><ul>{''.join(items)}</ul>" if items else ""


def _relative_href(key: str, base: str = ".") -> str:
    """A link to ``key`` that can only be a path under the profile's folder, ``base`` from the report (``.``: the
    report lives in it, as a stored one does; see :func:`write_report`).

    Every segment of ``key`` is percent-encoded (``javascript:x`` becomes ``javascript%3Ax``,
    so no segment reads as a scheme) and none climbs out of the profile's folder.
    """
    return base + "/" + "/".join(quote(part, safe="") for part in key.split("/") if part not in ("", ".", ".."))


def _folder_href(profile_folder: Path, report_folder: Path) -> str:
    """The profile's folder as a relative link from the report's, each segment percent-encoded."""
    relative = os.path.relpath(profile_folder.resolve(), report_folder.resolve())
    return "/".join(quote(part, safe="") for part in Path(relative).parts) or "."


def _artifacts(manifest: Manifest | None, base: str) -> str:
    if manifest is None:
        return ""
    rows = []
    for a in manifest.all_artifacts():
        # Artifact keys are relative to the profile folder (``base`` from the report).
        rows.append(
            f'<tr><td class=l><a href="{escape(_relative_href(a.key, base))}">{escape(a.key)}</a></td>'
            f"<td class=l>{escape(a.kind)}</td><td>{a.bytes:,}</td></tr>"
        )
    ranks = "".join(
        f"<tr><td>{r.rank}</td><td class=l>{escape(r.state.value)}</td><td class=l>{escape(r.reason or '')}</td></tr>" for r in manifest.ranks
    )
    return (
        f"<h2>Profile {escape(manifest.profile_id)}</h2><p>target {escape(manifest.target)}, status {escape(manifest.status.value)}, "
        f"steps {manifest.start_step}–{manifest.stop_step}</p>"
        + (f"<p>Taken by itself ({escape(manifest.trigger.watch_id or 'stall detector')}, "
           f"{escape(manifest.trigger.at.isoformat())}): {escape(manifest.trigger.detail)}</p>" if manifest.trigger else "")
        + (f"<p>After the window ({escape(manifest.post_window.verdict)}): {escape(manifest.post_window.detail)}</p>"
           if manifest.post_window else "")
        + f"<table><tr><th>rank</th><th class=l>state</th><th class=l>reason</th></tr>{ranks}</table>"
        f"<h2>Artifacts</h2><table><tr><th class=l>file</th><th class=l>kind</th><th>bytes</th></tr>{''.join(rows)}</table>"
    )


def _perfetto(manifest: Manifest | None) -> str:
    merged = [a for a in manifest.all_artifacts() if a.kind == "merged_trace"] if manifest else []
    if not merged:
        return ""
    return (
        f"<h2>Every rank on one timeline</h2><p>Download <code>{escape(merged[0].key)}</code> (below) and open it at "
        "<code>https://ui.perfetto.dev</code> (<em>Open trace file</em>; it reads the .gz as is), or in "
        "<code>chrome://tracing</code>. Each rank is a process named <em>rank N (host)</em>; ranks are aligned on their collectives where there are any.</p>"
    )


def render_report(summary: Summary, manifest: Manifest | None = None, memory: str = "", base: str = ".") -> str:
    """The report as an HTML string; ``memory`` is the rendered memory section, if one was recorded; ``base`` the
    profile's folder as a link from the report's (its artifacts' links start there)."""
    steps = f"{summary.steps[0]}–{summary.steps[-1]}" if summary.steps else "none"
    spread = ""
    if summary.step_spread:
        sp = summary.step_spread
        spread = f"; step time {sp.min_ms:.1f}–{sp.max_ms:.1f} ms across ranks (spread {sp.spread:.0%})"
        if sp.late_ranks:
            # The longest steps are the waiters': say who they wait for, so a waiter is not taken for the slow one.
            late = len(sp.late_ranks) == 1
            spread += (
                f"; {_ranks(sp.late_ranks)} {'starts its' if late else 'start their'} steps up to {sp.arrival_spread_ms:.1f} ms late"
                + (
                    f" and {_ranks(sp.waiting_ranks)} {'waits' if len(sp.waiting_ranks) == 1 else 'wait'} for {'it' if late else 'them'}"
                    if sp.waiting_ranks
                    else f", and no rank waits for {'it' if late else 'them'} long enough to count"
                )
            )
    title = f"rayprof report: {manifest.target} / {manifest.profile_id}" if manifest else "rayprof report"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{_CSS}</style></head><body>'
        f"<h1>{escape(title)}</h1>"
        f'<p class="muted">{escape(summary.source)}: {len(summary.ranks)} rank(s) analysed'
        f"{f' of world size {summary.world_size}' if summary.world_size else ''}, steps {steps}{spread}.</p>"
        f"{f'<p>{escape(step)}</p>' if (step := one_step(summary, manifest)) else ''}"
        f"<h2>Findings</h2>{_findings(summary)}"
        f"<h2>Ranks</h2>{_rank_table(summary)}"
        f"<h2>Where each rank's step goes</h2>{_phase_bars(summary.ranks)}"
        f"{_idle_bars(summary.ranks)}"
        f"<h2>Step time</h2>{_step_chart(summary.ranks)}"
        f"<h2>Top operators</h2>{_top_ops(summary.ranks)}"
        f"{memory}{_problems(summary)}{_perfetto(manifest)}{_artifacts(manifest, base)}"
        "</body></html>"
    )


def write_report(
    summary: Summary, out_path: Path, manifest: Manifest | None = None, memory: str = "", profile_folder: Path | None = None
) -> Path:
    """Write ``report.html`` (a new temp file beside it, then rename) and return its path; its artifact links lead
    to ``profile_folder`` (default: the report's own folder).

    The temp file is created exclusively under a random name: a link planted in a
    shared folder cannot make this write elsewhere, and the rename replaces a link
    at ``out_path`` instead of writing through it.
    """
    out_path = Path(out_path)
    fd, name = tempfile.mkstemp(dir=out_path.parent, prefix=f".{out_path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            base = "." if profile_folder is None else _folder_href(profile_folder, out_path.parent)
            f.write(render_report(summary, manifest, memory, base))
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path
