"""A comparison of two profiles as HTML (a report section, or a page of its own) and as plain text.

Same rules as :mod:`orchestrator.analysis.report`: no scripts, nothing from a
CDN, every value from a trace or manifest HTML-escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from orchestrator.analysis.diff import Change, OpChange, ProfileDiff
from orchestrator.analysis.report import PHASE_COLORS

__all__ = ["diff_lines", "render_diff_page", "render_diff_section", "write_diff_report"]

_VERDICT_WORDS = {
    "decreased": "shrank",
    "increased": "grew",
    "unchanged": "no change",
    "too_few_steps": "too few steps",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child,td.l,th.l{text-align:left}
.claim{border-left:4px solid #59a14f;padding:.4em .8em;margin:.5em 0;background:#f2f8f1}
.warn{border-left:4px solid #e15759;padding:.4em .8em;margin:.5em 0;background:#fdf3f3}
.muted{color:#777}.decreased{color:#2d7a2d}.increased{color:#b22}.sw{display:inline-block;width:.9em;height:.9em;vertical-align:-.1em;margin-right:.3em}
"""


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _spread(change: Change, side: str) -> str:
    d = change.a if side == "a" else change.b
    return "–" if d is None else f"{d.median_ms:.2f} [{d.q1_ms:.2f}–{d.q3_ms:.2f}]"


def _change_cells(change: Change) -> str:
    pct = f"{change.delta_fraction:+.0%}" if change.delta_fraction is not None else "–"
    p = _num(change.p_value, 3)
    return (
        f"<td>{_spread(change, 'a')}</td><td>{_spread(change, 'b')}</td><td>{_num(change.delta_ms)}</td><td>{pct}</td>"
        f"<td>{p}</td><td class='l {change.verdict}'>{_VERDICT_WORDS[change.verdict]}</td>"
    )


_CHANGE_HEAD = (
    "<th>A median [IQR] ms</th><th>B median [IQR] ms</th><th>Δ ms</th><th>Δ %</th><th>p</th><th class=l>verdict</th>"
)


def _ops_table(title: str, ops: list[OpChange]) -> str:
    if not ops:
        return f"<h3>{escape(title)}</h3><p class=muted>No change above 1% of the step.</p>"
    rows = []
    for op in ops:
        status = (
            op.status
            if not op.bound
            else {"added": "entered top list", "removed": "left top list"}.get(op.status, op.status)
        )
        rows.append(
            f"<tr><td class=l>{escape(op.name[:120])}</td><td class=l>{escape(status)}</td><td>{_num(op.a_ms_per_step)}</td>"
            f"<td>{_num(op.b_ms_per_step)}</td><td>{'≤ ' if op.bound else ''}{op.delta_ms_per_step:+.2f}</td></tr>"
        )
    return (
        f"<h3>{escape(title)}</h3><table><tr><th class=l>name</th><th class=l>status</th><th>A ms/step</th>"
        f"<th>B ms/step</th><th>Δ ms/step</th></tr>{''.join(rows)}</table>"
    )


def render_diff_section(diff: ProfileDiff) -> str:
    """The comparison as an HTML fragment (a ``<section>``) to place in a report."""
    parts = [f"<section id=comparison><h2>Comparison: {escape(diff.a.label)} → {escape(diff.b.label)}</h2>"]
    if not diff.comparable:
        reasons = "".join(f"<li>{escape(r)}</li>" for r in diff.not_comparable)
        parts.append(f"<div class=warn><strong>Not comparable; no change is claimed.</strong><ul>{reasons}</ul></div>")
    elif diff.claims:
        parts.extend(f"<div class=claim>{escape(c)}</div>" for c in diff.claims)
    else:
        parts.append("<p>No change claimed: the differences are within the steps' own spread.</p>")
    parts.append(f"<p class=muted>{escape(diff.method)}</p>")
    parts.append(f"<table><tr><th class=l>what</th>{_CHANGE_HEAD}</tr>")
    parts.append(f"<tr><td class=l><strong>step time</strong></td>{_change_cells(diff.step_time)}</tr>")
    for pc in diff.phases:
        swatch = f"<span class=sw style='background:{PHASE_COLORS[pc.phase]}'></span>"
        parts.append(f"<tr><td class=l>{swatch}{pc.phase}</td>{_change_cells(pc.change)}</tr>")
    parts.append("</table>")
    if len(diff.ranks) > 1:
        parts.append(f"<h3>Per rank</h3><table><tr><th class=l>rank</th>{_CHANGE_HEAD}</tr>")
        parts.extend(f"<tr><td class=l>{rd.rank}</td>{_change_cells(rd.step_time)}</tr>" for rd in diff.ranks)
        parts.append("</table>")
    parts.append(_ops_table("Operators (self CPU time)", diff.ops))
    parts.append(_ops_table("GPU kernels", diff.kernels))
    resolved = "".join(f"<li>{escape(f.title)}</li>" for f in diff.findings.resolved) or "<li>none</li>"
    new = "".join(f"<li>{escape(f.title)}</li>" for f in diff.findings.new) or "<li>none</li>"
    parts.append(f"<h3>Findings</h3><p>Resolved:</p><ul>{resolved}</ul><p>New:</p><ul>{new}</ul>")
    if diff.findings.persisting:
        parts.append(f"<p>Still present: {escape(', '.join(diff.findings.persisting))}</p>")
    parts.extend(f"<p class=muted>{escape(n)}</p>" for n in diff.notes)
    parts.append("</section>")
    return "".join(parts)


def render_diff_page(diff: ProfileDiff) -> str:
    """A self-contained HTML page holding the comparison section."""
    title = f"rayprof comparison: {diff.a.label} → {diff.b.label}"
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>{render_diff_section(diff)}</body></html>"
    )


def write_diff_report(diff: ProfileDiff, out_path: Path) -> Path:
    """Write :func:`render_diff_page` to ``out_path``."""
    out_path.write_text(render_diff_page(diff), encoding="utf-8")
    return out_path


def _line(what: str, change: Change) -> str:
    pct = f"{change.delta_fraction:+.0%}" if change.delta_fraction is not None else "–"
    delta = f"{change.delta_ms:+.2f}" if change.delta_ms is not None else "–"
    p = f"p={change.p_value:.3f}" if change.p_value is not None else ""
    return (
        f"  {what:<10} {_spread(change, 'a'):>24} {_spread(change, 'b'):>24} {delta:>9} {pct:>6}  "
        f"{_VERDICT_WORDS[change.verdict]} {p}".rstrip()
    )


def diff_lines(diff: ProfileDiff) -> list[str]:
    """The comparison as plain text, for ``rayprof diff``."""
    lines = [f"A: {diff.a.label}  ({len(diff.a.ranks)} rank(s), steps {diff.a.steps})"]
    lines.append(f"B: {diff.b.label}  ({len(diff.b.ranks)} rank(s), steps {diff.b.steps})")
    if not diff.comparable:
        lines.append("NOT COMPARABLE, no change is claimed:")
        lines.extend(f"  - {r}" for r in diff.not_comparable)
    elif diff.claims:
        lines.append("Changed:")
        lines.extend(f"  - {c}" for c in diff.claims)
    else:
        lines.append("No change claimed: the differences are within the steps' own spread.")
    lines.append("")
    lines.append(f"  {'':<10} {'A median [IQR] ms':>24} {'B median [IQR] ms':>24} {'Δ ms':>9} {'Δ %':>6}  verdict")
    lines.append(_line("step time", diff.step_time))
    lines.extend(_line(pc.phase, pc.change) for pc in diff.phases)
    if len(diff.ranks) > 1:
        lines.append("per rank step time:")
        lines.extend(_line(f"rank {rd.rank}", rd.step_time) for rd in diff.ranks)
    for title, ops in (("operators (self CPU ms/step)", diff.ops), ("GPU kernels (ms/step)", diff.kernels)):
        if ops:
            lines.append(f"{title}, largest changes:")
            for op in ops:
                status = op.status if not op.bound else {"added": "entered top", "removed": "left top"}[op.status]
                bound = "<=" if op.bound else ""
                lines.append(f"  {bound}{op.delta_ms_per_step:+8.2f}  {status:<11} {op.name[:90]}")
    lines.append("findings resolved: " + (", ".join(f.code for f in diff.findings.resolved) or "none"))
    lines.append("findings new: " + (", ".join(f.code for f in diff.findings.new) or "none"))
    lines.extend(f"note: {n}" for n in diff.notes)
    lines.append(f"method: {diff.method}")
    return lines
