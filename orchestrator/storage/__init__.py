"""Artifact storage: cluster storage (a shared path) or S3-compatible object storage.

Every write is all-or-nothing: a file is written under a temporary name and
renamed; an S3 object exists only once its (multipart) upload completes. Only
then is an :class:`~orchestrator.models.profile.Artifact` with size and sha256 returned,
so whatever lists an artifact lists a complete one.
"""

from __future__ import annotations

import functools
from urllib.parse import urlparse

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.storage.base import Storage, sha256_file
from orchestrator.storage.local import FileStorage, MemoryStorage
from orchestrator.storage.s3 import S3Storage

__all__ = [
    "FileStorage",
    "MemoryStorage",
    "S3Storage",
    "Storage",
    "open_storage",
    "sha256_file",
]


@functools.lru_cache(maxsize=16)
def open_storage(spec: StorageSpec) -> Storage:
    """The storage a spec names (its root normalized by the spec); cached so each process keeps
    one S3 client per root."""
    parsed = urlparse(spec.uri)
    if parsed.scheme == "s3":
        return S3Storage(
            parsed.netloc, parsed.path.lstrip("/"), endpoint_url=spec.s3_endpoint_url, region=spec.s3_region
        )
    return FileStorage(parsed.path)
