"""Reading, writing and verifying ``manifest.json``, the commit point of a profile."""

from __future__ import annotations

import hashlib
from pathlib import Path

from orchestrator.errors import IntegrityError, StorageError
from orchestrator.layout import MANIFEST_NAME, manifest_key, profile_prefix
from orchestrator.models.common import read_lenient
from orchestrator.models.profile import Manifest
from orchestrator.storage import Storage

__all__ = ["read_artifact", "read_folder_manifest", "read_manifest", "verify_manifest", "write_manifest"]


def read_artifact(storage: Storage, manifest: Manifest, key: str, sha256: str) -> bytes:
    """One artifact of a profile, from ``{storage}/{target}/{profile_id}/{key}`` (never the manifest's
    ``storage_uri``), checked against the checksum the manifest lists."""
    data = _files(storage, manifest).get_bytes(key)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(f"{key} of {manifest.profile_id} does not match its manifest checksum")
    return data


def write_manifest(storage: Storage, manifest: Manifest) -> str:
    """Write the manifest (last, after every artifact it lists); returns its URI.

    Refuses to list an artifact that is not in storage: a manifest never
    points at a missing file.
    """
    files = _files(storage, manifest)
    for artifact in manifest.all_artifacts():
        if not files.exists(artifact.key):
            raise IntegrityError(
                f"{artifact.uri} is listed but missing from storage", profile_id=manifest.profile_id
            )
    key = manifest_key(manifest.target, manifest.profile_id)
    # Written once: another controller on the same root, or a stale retry, must never replace it.
    storage.put_bytes(manifest.model_dump_json(indent=2).encode(), key, "manifest", if_absent=True)
    return storage.uri(key)


def read_manifest(storage: Storage, target: str, profile_id: str) -> Manifest:
    """Load a manifest from storage (written once, never written back: read as another release may have written it)."""
    key = manifest_key(target, profile_id)
    return read_lenient(Manifest, storage.get_bytes(key), source=storage.uri(key))


def read_folder_manifest(folder: Path) -> Manifest | None:
    """The manifest of a downloaded profile folder (None: ``folder`` holds none, as a plain folder of traces)."""
    path = folder / MANIFEST_NAME
    return read_lenient(Manifest, path.read_bytes(), source=str(path)) if path.is_file() else None


def verify_manifest(storage: Storage, manifest: Manifest) -> list[str]:
    """Problems found re-reading every listed artifact (empty when all bytes match)."""
    import hashlib

    problems = []
    files = _files(storage, manifest)
    for artifact in manifest.all_artifacts():
        try:
            data = files.get_bytes(artifact.key)
        except StorageError as e:
            problems.append(f"{artifact.uri}: {e}")
            continue
        if len(data) != artifact.bytes:
            problems.append(f"{artifact.uri}: {len(data)} bytes, manifest says {artifact.bytes}")
        elif hashlib.sha256(data).hexdigest() != artifact.sha256:
            problems.append(f"{artifact.uri}: sha256 differs from the manifest")
    return problems


def _files(storage: Storage, manifest: Manifest) -> Storage:
    """The profile's folder, where the keys its manifest lists are relative to."""
    return storage.scoped(profile_prefix(manifest.target, manifest.profile_id))
