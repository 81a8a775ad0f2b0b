"""MCP resources: a profile's report as compact text and its manifest as compact JSON.

Not report.html (hundreds of KiB of SVG an agent cannot read): the report here is
the analysis in a few lines per finding and rank. Both are capped like the tools'
answers, and every location in them is shown without credentials.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import InvalidRequestError, RayprofError
from orchestrator.mcp import convert
from orchestrator.mcp.bounds import MAX_ANSWER_BYTES, cut, public_uri, rounded
from orchestrator.mcp.results import Analysis
from orchestrator.mcp.tool_errors import tool_error
from orchestrator.mcp.tools import ClientSource
from orchestrator.models.common import Name
from orchestrator.models.profile import Manifest

__all__ = ["add_resources", "manifest_json", "report_text"]

_NAME = TypeAdapter(Name)


def report_text(manifest: Manifest, analysis: Analysis | None) -> str:
    """The analysis in plain lines: findings with savings, stragglers, per-rank time and idle."""
    lines = [
        f"rayprof profile {manifest.profile_id} of {manifest.target}: {manifest.status.value}"
        + (f" ({manifest.reason})" if manifest.reason else ""),
        f"steps {manifest.start_step}..{manifest.stop_step}, ranks {len(manifest.ranks)}",
    ]
    if analysis is None:
        lines.append("no analysis" + (f": {manifest.analysis_error}" if manifest.analysis_error else ""))
        return "\n".join(lines) + "\n"
    lines.extend([f"caution: {analysis.caution}"] if analysis.caution else [])  # it qualifies every figure below
    lines.append(f"verdict: {analysis.verdict}")
    lines.append(f"findings ({len(analysis.findings)}), largest saving first:")
    for f in analysis.findings:
        lines.append(
            f"- [{f.severity}] {f.code}: {f.title} (save {'at least' if f.saving_floor else 'up to'} {f.max_saving_ms:.1f} ms/step, "
            f"{f.max_saving_fraction:.0%}; ranks {f.ranks})\n  evidence: {f.evidence}\n  fix: {f.fix}"
        )
    for s in analysis.stragglers:
        lines.append(
            f"straggler: rank {s.rank} ({s.cause}) +{s.excess_ms:.1f} ms/step ({s.excess_fraction:.0%}), "
            f"mostly {s.phase} (+{s.phase_excess_ms:.1f} ms)"
        )
    for g in analysis.slow_groups:
        lines.append(
            f"slow link: process group {g.name} (ranks {g.ranks}) collectives {g.transfer_ms:.1f} ms/step against "
            f"{g.peer_transfer_ms:.1f} in its {g.peers - 1} peer group(s)"
        )
    if analysis.step_spread is not None:
        sp = analysis.step_spread
        lines.append(
            f"step time across ranks: {sp.min_ms:.1f}..{sp.max_ms:.1f} ms (median {sp.median_ms:.1f}), "
            f"slowest rank {sp.slowest_rank}"
        )
    for r in analysis.ranks:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r.phases_ms.model_dump().items() if v >= 0.05)
        idle = ", ".join(f"{c.cause} {c.ms_per_step:.1f}" for c in r.idle_causes)
        mean = f"{r.mean_step_ms:.1f} ms" if r.mean_step_ms is not None else "-"
        median = f"{r.median_step_ms:.1f} ms" if r.median_step_ms is not None else "-"
        lines.append(
            f"rank {r.rank}: mean step {mean} (median {median}); mean phases ms: {phases}; "
            f"waits for others {r.waits_for_others_ms:.1f} ms"
            + (f"; device idle ms/step: {idle}" if idle else "")
        )
    lines.extend(f"note: {issue}" for issue in analysis.issues)
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_ANSWER_BYTES:
        text = text.encode()[:MAX_ANSWER_BYTES].decode(errors="ignore") + "\n[truncated: get_findings has it typed]\n"
    return text


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")


def _public(data: Any) -> Any:
    """Every URL in a manifest's JSON (artifact and storage locations, experiment paths) without
    credentials (see :func:`public_uri`); text that merely mentions one is left as it is."""
    if isinstance(data, str):
        return public_uri(data) if _URL.match(data) else data
    if isinstance(data, dict):
        return {k: _public(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_public(v) for v in data]
    return data


def manifest_json(manifest: Manifest) -> str:
    """The manifest as compact JSON, locations without credentials, capped (``truncated`` says what went)."""
    data = rounded(_public(manifest.model_dump(mode="json")))
    note = cut(data)
    if note is not None:
        data["truncated"] = note
    return json.dumps(data, separators=(",", ":"))


def add_resources(server: MCPServer, client: ClientSource) -> None:
    def manifest_of(profile_id: str) -> Manifest:
        try:
            return client().get(_NAME.validate_python(profile_id)).manifest()
        except ValidationError:
            raise ResourceError(tool_error(InvalidRequestError(f"invalid profile id {profile_id!r}")).args[0]) from None
        except RayprofError as e:
            raise ResourceError(tool_error(e).args[0]) from e

    @server.resource(
        convert.report_resource("{profile_id}"),
        name="report",
        description="A profile's analysis as compact text: findings with savings, stragglers, per-rank time.",
        mime_type="text/plain",
    )
    def report(profile_id: str) -> str:
        manifest = manifest_of(profile_id)
        return report_text(manifest, convert.analysis_of(manifest))

    @server.resource(
        convert.manifest_resource("{profile_id}"),
        name="manifest",
        description="A profile's manifest (per-rank outcome, artifacts, summary) as compact JSON, capped.",
        mime_type="application/json",
    )
    def manifest(profile_id: str) -> str:
        return manifest_json(manifest_of(profile_id))
