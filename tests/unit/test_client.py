"""Downloads by the client, without Ray: files come from the storage the profile's record names and stay in their folder."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.client.client import ProfileHandle, download_profile
from orchestrator.errors import IntegrityError, InvalidRequestError
from orchestrator.layout import MANIFEST_NAME, profile_prefix
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.profile import Artifact, Manifest, ProfileStatus
from orchestrator.storage import FileStorage

TARGET, PROFILE_ID = "run", "prof-1"


def _stored(root, key: str, data: bytes) -> Artifact:
    """``data`` stored under the profile folder of ``root``; its artifact (key relative to that folder)."""
    return FileStorage(root).scoped(profile_prefix(TARGET, PROFILE_ID)).put_bytes(data, key, "trace")


def _manifest(artifacts: list[Artifact], *, profile_id: str = PROFILE_ID, storage_uri: str = "file:///elsewhere") -> dict:
    return {
        "profile_id": profile_id,
        "target": TARGET,
        "status": "DONE",
        "request": {"target": TARGET, "steps": 1},
        "storage_uri": storage_uri,
        "start_step": 1,
        "stop_step": 2,
        "ranks": [{"rank": 0, "state": "DONE", "artifacts": [a.model_dump() for a in artifacts]}],
        "requested_at": "2024-01-01T00:00:00Z",
        "finished_at": "2024-01-01T00:00:01Z",
    }


def _committed(root, manifest: dict) -> dict:
    """``manifest`` written where a profile's commit writes it, in the profile folder under ``root``."""
    FileStorage(root).scoped(profile_prefix(TARGET, manifest["profile_id"])).put_bytes(
        json.dumps(manifest).encode(), MANIFEST_NAME, "manifest"
    )
    return manifest


class _Backend:
    """The two calls a download makes, answered from fixed values."""

    def __init__(self, manifest: dict, storage: StorageSpec) -> None:
        self._manifest = Manifest.model_validate(manifest, extra="ignore")
        self._storage = storage

    def call(self, name: str, *args):
        return getattr(self, name)(*args)

    def manifest(self, profile_id: str) -> Manifest:
        return self._manifest

    def profile_storage(self, profile_id: str) -> StorageSpec:
        return self._storage


def _handle(backend: _Backend, profile_id: str = PROFILE_ID) -> ProfileHandle:
    status = ProfileStatus.model_validate(
        {
            "id": profile_id,
            "target": TARGET,
            "state": "DONE",
            "request": {"target": TARGET, "steps": 1},
            "storage_uri": "file:///x",
            "created_at": "2024-01-01T00:00:00Z",
        }
    )
    return ProfileHandle(backend, status)  # type: ignore[arg-type]


def test_download_reads_the_storage_the_record_names_not_the_manifests_storage_uri(tmp_path):
    configured, decoy = tmp_path / "configured", tmp_path / "decoy"
    artifact = _stored(configured, "traces/r0.json", b"real")
    _stored(decoy, "traces/r0.json", b"decoy")
    manifest = _committed(configured, _manifest([artifact], storage_uri=FileStorage(decoy).uri(f"{TARGET}/{PROFILE_ID}")))

    folder = _handle(_Backend(manifest, StorageSpec(uri=configured.as_uri()))).download(tmp_path / "dl")

    assert (folder / "traces" / "r0.json").read_bytes() == b"real"


def test_a_download_keeps_the_stored_manifest_as_written_with_fields_this_release_does_not_know(tmp_path):
    artifact = _stored(tmp_path / "store", "traces/r0.json", b"x")
    written = _committed(tmp_path / "store", {**_manifest([artifact]), "added_by_a_later_release": {"n": 1}})

    folder = _handle(_Backend(written, StorageSpec(uri=(tmp_path / "store").as_uri()))).download(tmp_path / "dl")

    assert json.loads((folder / MANIFEST_NAME).read_text()) == written


def test_a_file_already_downloaded_with_the_manifests_checksum_is_not_fetched_again(tmp_path):
    # `rayprof report ID` reports from its cache: a profile reported again must not be downloaded again.
    artifact = _stored(tmp_path / "store", "traces/r0.json", b"x")
    handle = _handle(_Backend(_committed(tmp_path / "store", _manifest([artifact])), StorageSpec(uri=(tmp_path / "store").as_uri())))
    handle.download(tmp_path / "dl")
    (tmp_path / "store" / TARGET / PROFILE_ID / "traces" / "r0.json").unlink()  # a second fetch would fail

    folder = handle.download(tmp_path / "dl")

    assert (folder / "traces" / "r0.json").read_bytes() == b"x"


def test_a_local_copy_that_differs_from_the_manifest_is_fetched_again(tmp_path):
    artifact = _stored(tmp_path / "store", "traces/r0.json", b"x")
    handle = _handle(_Backend(_committed(tmp_path / "store", _manifest([artifact])), StorageSpec(uri=(tmp_path / "store").as_uri())))
    (tmp_path / "dl" / "traces").mkdir(parents=True)
    (tmp_path / "dl" / "traces" / "r0.json").write_bytes(b"cut short")

    folder = handle.download(tmp_path / "dl")

    assert (folder / "traces" / "r0.json").read_bytes() == b"x"


def test_manifest_of_another_profile_is_refused(tmp_path):
    artifact = _stored(tmp_path / "store", "traces/r0.json", b"x")
    backend = _Backend(_manifest([artifact], profile_id="prof-other"), StorageSpec(uri=(tmp_path / "store").as_uri()))

    with pytest.raises(IntegrityError, match="got the one of run/prof-other"):
        _handle(backend).download(tmp_path / "dl")
    assert not (tmp_path / "dl").exists()


def test_artifact_key_that_escapes_the_destination_writes_nothing(tmp_path):
    good = _stored(tmp_path / "store", "traces/r0.json", b"x")
    # model_construct skips validation: a manifest as a hostile or buggy server could send it.
    evil = Artifact.model_construct(**{**good.model_dump(), "key": "../../outside.txt"})
    manifest = Manifest.model_construct(**{**Manifest.model_validate(_manifest([good])).__dict__, "artifacts": [evil]})

    with pytest.raises(IntegrityError, match="outside"):
        download_profile(manifest, StorageSpec(uri=(tmp_path / "store").as_uri()), tmp_path / "a" / "dl")
    assert not (tmp_path / "outside.txt").exists()
    assert not (tmp_path / "a").exists()


def test_symlink_in_the_destination_cannot_lead_files_out(tmp_path):
    artifact = _stored(tmp_path / "store", "traces/r0.json", b"x")
    dest, outside = tmp_path / "dl", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    os.symlink(outside, dest / "traces")

    with pytest.raises(IntegrityError, match="outside"):
        download_profile(Manifest.model_validate(_manifest([artifact])), StorageSpec(uri=(tmp_path / "store").as_uri()), dest)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("profile_id", ["../x", "/abs", "a/b", "x\x1b[2J"])
def test_unsafe_profile_id_is_refused_before_any_call(profile_id):
    from orchestrator.client import ProfilingClient

    class _Unreachable:
        def get(self, profile_id: str):
            raise AssertionError("no call may be made")

    with pytest.raises(InvalidRequestError, match="invalid profile id"):
        ProfilingClient(backend=_Unreachable()).get(profile_id)  # type: ignore[arg-type]


# ---- the service URL a user types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["localhost:8000", "127.0.0.1:8000", "ftp://host/x", "http://", "rayprof", "http://[", "http://:80", "https://x:99999"]
)
def test_a_service_url_that_is_not_http_is_a_usage_error_naming_the_fix(url):
    # Before: ControllerUnavailableError ("cannot reach ... unsupported protocol 'localhost://'"), exit 1 as if the
    # service were down, at the first call.
    from orchestrator.client import ProfilingClient

    with pytest.raises(InvalidRequestError, match=r"is not an http\(s\) URL: use http://HOST:PORT"):
        ProfilingClient(url)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"\Ahttps?://[\[\]:@a-z0-9.%/ ]{0,30}\Z"))
def test_any_text_as_a_service_url_is_taken_or_refused_as_a_usage_error(text):
    from orchestrator.client import ProfilingClient

    try:
        ProfilingClient(f"http://{text}") if text.startswith("h") else ProfilingClient(text)
    except InvalidRequestError:
        pass
