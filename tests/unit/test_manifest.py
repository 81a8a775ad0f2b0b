"""The manifest is written last and never lists a missing or altered file."""

from __future__ import annotations

import pytest

from orchestrator.errors import IntegrityError
from orchestrator.layout import manifest_key
from orchestrator.manifest import read_manifest, verify_manifest, write_manifest
from orchestrator.models.common import utcnow
from orchestrator.models.profile import Manifest, RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from orchestrator.storage import MemoryStorage


def _manifest(storage: MemoryStorage) -> Manifest:
    artifact = storage.scoped("run/p1").put_bytes(b"trace-bytes", "traces/rank0.h.1.pt.trace.json.gz", "trace")
    return Manifest(
        profile_id="p1",
        target="run",
        status=ProfileState.DONE,
        request=ProfileRequest(target="run", steps=1),
        storage_uri=storage.uri("run/p1"),
        start_step=10,
        stop_step=11,
        ranks=[RankResult(rank=0, state=RankState.DONE, artifacts=[artifact])],
        requested_at=utcnow(),
        finished_at=utcnow(),
    )


def test_written_manifest_reads_back_equal():
    storage = MemoryStorage()
    manifest = _manifest(storage)
    uri = write_manifest(storage, manifest)
    assert uri == storage.uri(manifest_key("run", "p1"))
    assert read_manifest(storage, "run", "p1") == manifest


def test_manifest_listing_a_missing_artifact_is_not_written():
    storage = MemoryStorage()
    manifest = _manifest(storage)
    storage.delete("run/p1/traces/rank0.h.1.pt.trace.json.gz")
    with pytest.raises(IntegrityError, match="missing"):
        write_manifest(storage, manifest)
    assert not storage.exists(manifest_key("run", "p1"))


def test_verify_reports_altered_bytes():
    storage = MemoryStorage()
    manifest = _manifest(storage)
    storage.put_bytes(b"trace-bytez", "run/p1/traces/rank0.h.1.pt.trace.json.gz", "trace")
    assert verify_manifest(storage, manifest) == [f"{manifest.ranks[0].artifacts[0].uri}: sha256 differs from the manifest"]


def test_verify_is_clean_on_intact_files():
    storage = MemoryStorage()
    assert verify_manifest(storage, _manifest(storage)) == []
