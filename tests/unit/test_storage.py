"""File and S3 storage: complete writes, checksums, listing, bounded retries."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from orchestrator.errors import AlreadyExistsError, IntegrityError, StorageError
from orchestrator.layout import normalize_uri
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.storage import FileStorage, MemoryStorage, S3Storage, open_storage


@pytest.fixture(params=["file", "memory", "s3"])
def storage(request, tmp_path):
    if request.param == "file":
        return FileStorage(tmp_path / "root")
    if request.param == "memory":
        return MemoryStorage()
    s3 = request.getfixturevalue("s3_server")
    return open_storage(
        StorageSpec(uri=f"s3://{s3.bucket}/unit-{uuid.uuid4().hex[:8]}", s3_endpoint_url=s3.endpoint_url)
    )


def test_put_file_returns_size_and_sha256_of_the_stored_bytes(storage, tmp_path):
    local = tmp_path / "a.bin"
    local.write_bytes(os.urandom(10_000))

    artifact = storage.scoped("t/p").put_file(local, "traces/a.bin", "trace")

    assert artifact.key == "traces/a.bin"
    assert artifact.bytes == 10_000
    assert artifact.sha256 == hashlib.sha256(local.read_bytes()).hexdigest()
    assert storage.get_bytes("t/p/traces/a.bin") == local.read_bytes()
    assert artifact.uri == storage.uri("t/p/traces/a.bin")


def test_list_returns_keys_under_a_prefix(storage):
    for key in ["a/1", "a/b/2", "c/3"]:
        storage.put_bytes(b"x", key, "trace")
    assert storage.list("a/") == ["a/1", "a/b/2"]


def test_download_verifies_the_checksum(storage, tmp_path):
    storage.put_bytes(b"hello", "k", "trace")
    with pytest.raises(IntegrityError, match="does not match"):
        storage.download("k", tmp_path / "out", expected_sha256="0" * 64)
    assert not (tmp_path / "out").exists()
    assert storage.download("k", tmp_path / "ok", hashlib.sha256(b"hello").hexdigest()).read_bytes() == b"hello"


def test_missing_key_is_a_storage_error(storage):
    with pytest.raises(StorageError):
        storage.get_bytes("nope")
    assert not storage.exists("nope")


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../../b", "a//b"])
def test_keys_cannot_escape_the_root(key):
    with pytest.raises(StorageError, match="invalid storage key"):
        MemoryStorage().put_bytes(b"x", key, "trace")


def test_file_write_leaves_no_temporary_files(tmp_path):
    storage = FileStorage(tmp_path)
    storage.put_bytes(b"data", "p/f", "trace")
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["f"]


def test_large_s3_upload_goes_multipart_and_keeps_its_checksum(s3_server, tmp_path):
    storage = open_storage(StorageSpec(uri=f"s3://{s3_server.bucket}/big", s3_endpoint_url=s3_server.endpoint_url))
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(17 * 1024 * 1024))

    artifact = storage.put_file(local, "big.bin", "trace")

    head = storage._client.head_object(Bucket=s3_server.bucket, Key="big/big.bin")
    assert "-" in head["ETag"]  # multipart ETags carry a part count
    assert artifact.sha256 == hashlib.sha256(local.read_bytes()).hexdigest()
    assert storage.download("big.bin", tmp_path / "back", artifact.sha256).stat().st_size == artifact.bytes


def test_unreachable_s3_fails_after_bounded_retries(tmp_path):
    storage = S3Storage("bucket", endpoint_url="http://127.0.0.1:9", retries=2)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(StorageError, match="after 2 attempts"):
        storage.put_file(tmp_path / "f", "f", "trace")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [("s3://b/p/", "s3://b/p"), ("/tmp/x/../y", "file:///tmp/y"), ("file:///tmp/z", "file:///tmp/z")],
)
def test_storage_uris_are_normalized(uri, expected):
    assert normalize_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3:///prefix", "gs://bucket/x", "http://host/x"])
def test_unsupported_storage_uris_are_refused(uri):
    from orchestrator.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        normalize_uri(uri)


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../../b"])
def test_download_of_a_bad_key_creates_no_folder(storage, tmp_path, key):
    dest = tmp_path / "dl" / "sub" / "f"

    with pytest.raises(StorageError, match="invalid storage key"):
        storage.download(key, dest)
    assert not (tmp_path / "dl").exists()


def test_folders_names_the_folders_directly_under_a_prefix(storage):
    for key in ("t/p1/manifest.json", "t/p2/traces/rank0.json", "t/top.txt", "u/x.json", "root.txt"):
        storage.put_bytes(b"{}", key, "manifest")

    assert storage.folders("") == ["t", "u"]
    assert storage.folders("t") == ["p1", "p2"]
    assert storage.folders("missing") == []


@pytest.mark.parametrize("uri", ["s3:///prefix", "gs://bucket/x"])
def test_a_storage_spec_holds_its_root_normalized_and_refuses_an_unsupported_one(uri):
    from orchestrator.errors import ConfigurationError

    assert StorageSpec(uri="s3://b/p/").uri == "s3://b/p"
    assert StorageSpec(uri="/tmp/x/../y").uri == StorageSpec(uri="file:///tmp/y").uri == "file:///tmp/y"
    with pytest.raises(ConfigurationError):
        StorageSpec(uri=uri)


def test_a_scoped_storage_addresses_the_keys_under_its_folder(storage, tmp_path):
    files = storage.scoped("t/p1")
    storage.put_bytes(b"sibling", "t/p10/traces/r0.json", "trace")

    artifact = files.put_bytes(b"x", "traces/r0.json", "trace")

    assert artifact.key == "traces/r0.json"
    assert artifact.uri == storage.uri("t/p1/traces/r0.json") == files.uri("traces/r0.json")
    assert files.root_uri == storage.uri("t/p1")
    assert storage.get_bytes("t/p1/traces/r0.json") == b"x" == files.scoped("traces").get_bytes("r0.json")
    assert files.exists("traces/r0.json") and not files.exists("traces/r1.json")
    assert files.list("") == ["traces/r0.json"]
    assert files.folders("") == ["traces"]
    assert files.download("traces/r0.json", tmp_path / "r0.json").read_bytes() == b"x"
    files.delete("traces/r0.json")
    assert not storage.exists("t/p1/traces/r0.json") and storage.exists("t/p10/traces/r0.json")


@pytest.mark.parametrize("key", ["../p2/x", "/abs", "a//b"])
def test_a_scoped_storage_refuses_a_key_that_leaves_its_folder(storage, key):
    with pytest.raises(StorageError, match="invalid storage key"):
        storage.scoped("t/p1").get_bytes(key)


def test_state_is_stored_as_the_same_bytes_an_artifact_write_leaves(storage):
    data = b'{"status": {"id": "p1"}}'
    storage.put_bytes(data, "_rayprof/c/profiles/old.json", "manifest")  # how state was written before

    assert storage.put_state(data, "_rayprof/c/profiles/new.json") is None
    assert storage.get_bytes("_rayprof/c/profiles/new.json") == storage.get_bytes("_rayprof/c/profiles/old.json") == data
    with pytest.raises(AlreadyExistsError):
        storage.put_state(b"{}", "_rayprof/c/profiles/new.json", if_absent=True)


@pytest.mark.parametrize("if_absent", [False, True])
def test_a_file_where_a_folder_should_be_is_a_storage_error_not_an_existing_key(tmp_path, if_absent):
    # Before: a write with if_absent=True answered "already exists" (409) for a key that did not exist.
    (tmp_path / "a").write_bytes(b"not a folder")
    with pytest.raises(StorageError, match="cannot write") as raised:
        FileStorage(tmp_path).put_state(b"{}", "a/b.json", if_absent=if_absent)
    assert not isinstance(raised.value, AlreadyExistsError)


def test_a_write_if_absent_over_an_existing_key_keeps_the_old_bytes(tmp_path):
    storage = FileStorage(tmp_path)
    storage.put_state(b"old", "a/b.json", if_absent=True)
    with pytest.raises(AlreadyExistsError):
        storage.put_state(b"new", "a/b.json", if_absent=True)
    assert (tmp_path / "a" / "b.json").read_bytes() == b"old" and os.listdir(tmp_path / "a") == ["b.json"]
