"""After the ranks finish: analyse and merge their traces, write the report.

The per-rank work (one read for the per-rank summary and the merge's scan,
a second for its compressed part) goes through a :data:`~orchestrator.traces.fanout.RankMap`:
in the controller, one Ray task per rank that fetches its own trace from
storage (sha256 checked), so the cluster does the parsing. What comes back is
small; the cross-rank analysis, the merged file's assembly and the report are
done here, and ``merged.trace.json.gz`` and ``report.html`` are uploaded
beside the traces. The controller then lists both in the manifest, with the
merge's :class:`~orchestrator.traces.merge_plan.MergeStats`, and writes it last.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.front import analyze_for_merge
from orchestrator.analysis.memory_chart import load_timelines, render_memory_section
from orchestrator.analysis.report import write_report
from orchestrator.layout import MERGED_TRACE_NAME, REPORT_NAME
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Artifact, Manifest
from orchestrator.scratch import scratch_prefix
from orchestrator.storage import open_storage
from orchestrator.traces.discover import TraceFile, TraceSet
from orchestrator.traces.fanout import RankMap, fetching, serial
from orchestrator.traces.merge import merge_traces
from orchestrator.traces.merge_plan import MergeStats

__all__ = ["PostprocessResult", "postprocess", "rank_traces"]


class PostprocessResult(BaseModel):
    """Profile-level artifacts, the machine-readable summary and what the merge kept; typed as the
    manifest holds them, so the controller lists them without converting anything."""

    model_config = ConfigDict(frozen=True)

    artifacts: list[Artifact]
    summary: Summary
    merge: MergeStats


def rank_traces(draft: Manifest) -> tuple[list[TraceFile], dict[Path, str]]:
    """The ranks' traces as the manifest lists them (``path`` is the key under the profile's folder), and
    their checksums. Rank, host and base time come from the manifest, so nothing is read to plan the work."""
    world_size = draft.cluster.get("world_size")
    files: list[TraceFile] = []
    sha256: dict[Path, str] = {}
    for rank in draft.ranks:
        for artifact in rank.artifacts:
            if artifact.kind == "trace":
                key = Path(artifact.key)
                files.append(
                    TraceFile(
                        rank=rank.rank, path=key, host=rank.host, base_time_ns=rank.base_time_ns or 0,
                        world_size=world_size if isinstance(world_size, int) else None,
                    )
                )
                sha256[key] = artifact.sha256
    return files, sha256


def postprocess(
    spec: StorageSpec, prefix: str, draft: Manifest, *, max_bytes: int | None = None, rank_map: RankMap = serial
) -> PostprocessResult:
    """Analyse and merge the traces ``draft`` lists; upload the merged trace and report."""
    storage = open_storage(spec).scoped(prefix)
    files, sha256 = rank_traces(draft)
    each_rank = fetching(rank_map, spec, prefix, sha256)
    traces = TraceSet(folder=Path(prefix), files=files, rejected=[], issues=[])
    summary, scans = analyze_for_merge(traces, rank_map=each_rank)
    summary = summary.model_copy(update={"source": draft.storage_uri})
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("post")) as tmp:
        folder = Path(tmp)
        for rank in draft.ranks:  # memory timelines are small: the report reads them here
            for artifact in rank.artifacts:
                if artifact.kind == "memory_timeline":
                    storage.download(artifact.key, folder / artifact.key, artifact.sha256)
        stats = merge_traces(files, folder / MERGED_TRACE_NAME, max_bytes=max_bytes, rank_map=each_rank, scans=scans)
        merged = storage.put_file(folder / MERGED_TRACE_NAME, MERGED_TRACE_NAME, "merged_trace")
        with_merged = draft.model_copy(update={"artifacts": [merged], "merge": stats})
        write_report(summary, folder / REPORT_NAME, manifest=with_merged, memory=render_memory_section(*load_timelines(folder)))
        report = storage.put_file(folder / REPORT_NAME, REPORT_NAME, "report")
    return PostprocessResult(artifacts=[merged, report], summary=summary, merge=stats)
