"""Each side of a diff, read from a local folder or from a stored profile.

A folder is a downloaded profile (``manifest.json`` with its summary, ``ops/``)
or any folder of rank traces, which is analysed here. A stored profile is its
manifest (the summary is inside) plus its op tables read from storage and
checked against the manifest's sha256.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pydantic import ValidationError

from orchestrator.analysis.diff import DiffInput, OpRow
from orchestrator.errors import InvalidRequestError
from orchestrator.layout import rank_in_name
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.analysis import Summary
from orchestrator.models.profile import Manifest

__all__ = ["load_folder", "load_stored", "parse_op_table", "read_local"]


def parse_op_table(text: str) -> list[OpRow]:
    """Rows of a ``key_averages.csv``, summed by operator name (the table may split them by input shape)."""
    by_name: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        acc = by_name.setdefault(row["name"], [0, 0.0, 0.0])
        acc[0] += int(row["count"])
        acc[1] += float(row["self_cpu_time_total_us"]) / 1000.0
        acc[2] += float(row["self_device_time_total_us"]) / 1000.0
    # A record_function range that overlaps its children (Optimizer.step#SGD.step) gets a negative self time:
    # it measures nothing, so it is left out rather than reported as a change.
    return [
        OpRow(name=n, calls=int(c), self_cpu_ms=cpu, self_device_ms=dev)
        for n, (c, cpu, dev) in by_name.items()
        if cpu >= 0
    ]


def _summary_of(manifest: Manifest, label: str) -> Summary:
    if manifest.summary is None:
        why = f": {manifest.analysis_error}" if manifest.analysis_error else ""
        raise InvalidRequestError(
            f"{label} has no analysis to compare (profile ended {manifest.status.value}{why})",
            profile_id=manifest.profile_id,
        )
    try:
        return Summary.model_validate(manifest.summary)
    except ValidationError as e:
        raise InvalidRequestError(f"{label}: its manifest's summary is not readable: {e}") from e


def _complete(tables: dict[int, list[OpRow]], summary: Summary) -> dict[int, list[OpRow]] | None:
    """The tables when every analysed rank has one; a partial set would compare unlike things."""
    return tables if tables and all(r.rank in tables for r in summary.ranks) else None


def read_local(path: Path, label: str) -> tuple[Summary, Manifest | None]:
    """The analysis of a downloaded profile folder (its manifest's summary), a folder of traces or one trace file
    (analysed now), and the folder's manifest; refused, saying why, where no rank trace is analysable."""
    from orchestrator.analysis.front import analyze_folder
    from orchestrator.manifest import read_folder_manifest

    manifest = read_folder_manifest(path) if path.is_dir() else None
    summary = _summary_of(manifest, label) if manifest is not None and manifest.summary is not None else analyze_folder(path)
    if not summary.ranks:
        # Why each file was refused (cut short, not a trace, ...) is what the user can act on.
        reasons = [*summary.issues, *(f"{r.path.name}: {r.reason}" for r in summary.rejected)]
        raise InvalidRequestError(f"{label}: no analysable rank trace ({'; '.join(reasons) or 'none found'})")
    return summary, manifest


def load_folder(path: Path, label: str | None = None) -> DiffInput:
    """A downloaded profile folder, a folder of traces or one trace file (analysed now), with its op tables."""
    path = Path(path)
    label = label or str(path)
    summary, manifest = read_local(path, label)
    tables: dict[int, list[OpRow]] = {}
    for csv_file in sorted((path / "ops").glob("rank*.key_averages.csv")):
        rank = rank_in_name(csv_file.name)
        if rank is not None:
            tables[rank] = parse_op_table(csv_file.read_text())
    return DiffInput(
        label=label,
        profile_id=manifest.profile_id if manifest else None,
        summary=summary,
        options=manifest.request if manifest else None,
        op_tables=_complete(tables, summary),
    )


def load_stored(manifest: Manifest, root: StorageSpec) -> DiffInput:
    """A stored profile, read from the configured storage ``root`` (never the manifest's ``storage_uri``)."""
    from orchestrator.manifest import read_artifact
    from orchestrator.storage import open_storage

    summary = _summary_of(manifest, manifest.profile_id)
    storage = open_storage(root)
    tables: dict[int, list[OpRow]] = {}
    for rank in manifest.ranks:
        for artifact in rank.artifacts:
            if artifact.kind == "op_table":
                data = read_artifact(storage, manifest, artifact.key, artifact.sha256)
                tables[rank.rank] = parse_op_table(data.decode("utf-8"))
    return DiffInput(
        label=manifest.profile_id,
        profile_id=manifest.profile_id,
        summary=summary,
        options=manifest.request,
        op_tables=_complete(tables, summary),
    )
