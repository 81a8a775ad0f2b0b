"""After the ranks finish: merge their traces, analyse them, write the report.

Runs as a Ray task so the controller's event loop stays responsive while
traces are parsed. It downloads the rank traces it is given (verifying
sha256), and uploads ``merged.trace.json.gz`` and ``report.html`` beside
them; the controller then lists both in the manifest and writes it last.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.memory_chart import load_timelines, render_memory_section
from orchestrator.analysis.report import write_report
from orchestrator.layout import MERGED_TRACE_NAME, REPORT_NAME
from orchestrator.models import Artifact, Manifest, StorageSpec
from orchestrator.storage import open_storage
from orchestrator.traces.merge import merge_traces

__all__ = ["PostprocessResult", "postprocess"]


class PostprocessResult(BaseModel):
    """Profile-level artifacts and the machine-readable summary."""

    model_config = ConfigDict(frozen=True)

    artifacts: list[Artifact]
    summary: dict[str, Any]


def postprocess(spec: StorageSpec, prefix: str, draft: Manifest) -> PostprocessResult:
    """Merge and analyse the traces ``draft`` lists; upload the merged trace and report."""
    storage = open_storage(spec)
    with tempfile.TemporaryDirectory(prefix="rayprof-post-") as tmp:
        folder = Path(tmp)
        inputs = []
        for rank in draft.ranks:
            for artifact in rank.artifacts:
                if artifact.kind == "trace":
                    local = storage.download(f"{prefix}/{artifact.key}", folder / artifact.key, artifact.sha256)
                    inputs.append((rank.rank, rank.host, local))
                elif artifact.kind == "memory_timeline":
                    storage.download(f"{prefix}/{artifact.key}", folder / artifact.key, artifact.sha256)
        merge_traces(inputs, folder / MERGED_TRACE_NAME)
        merged = storage.put_file(folder / MERGED_TRACE_NAME, f"{prefix}/{MERGED_TRACE_NAME}", "merged_trace", folder=prefix)
        summary = analyze_folder(folder).model_copy(update={"source": draft.storage_uri})
        with_merged = draft.model_copy(update={"artifacts": [merged]})
        write_report(summary, folder / REPORT_NAME, manifest=with_merged, memory=render_memory_section(*load_timelines(folder)))
        report = storage.put_file(folder / REPORT_NAME, f"{prefix}/{REPORT_NAME}", "report", folder=prefix)
    return PostprocessResult(artifacts=[merged, report], summary=summary.model_dump(mode="json"))
