"""Artifact storage: cluster storage (a shared path) or S3-compatible object storage.

Every write is all-or-nothing: a file is written under a temporary name and
renamed; an S3 object exists only once its (multipart) upload completes. Only
then is an :class:`~orchestrator.models.Artifact` with size and sha256 returned,
so whatever lists an artifact lists a complete one.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

from orchestrator.config import normalize_uri
from orchestrator.errors import AlreadyExistsError, IntegrityError, StorageError
from orchestrator.layout import MANIFEST_NAME
from orchestrator.models import Artifact, ArtifactKind, StorageSpec
from orchestrator.settings import (
    DEFAULT_UPLOAD_RETRIES,
    MULTIPART_THRESHOLD_BYTES,
    UPLOAD_RETRIES_ENV_VAR,
    env_int,
)

__all__ = [
    "FileStorage",
    "MemoryStorage",
    "S3Storage",
    "Storage",
    "open_storage",
    "sha256_file",
]

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
T = TypeVar("T")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_key(key: str) -> str:
    # Keys come from our own code, but a bug must not write outside the root.
    parts = key.split("/")
    if any(p in ("..", ".", "") for p in parts):
        raise StorageError(f"invalid storage key {key!r}")
    return key


class Storage(abc.ABC):
    """A root under which profiles are stored, addressed by relative keys."""

    root_uri: str

    def uri(self, key: str) -> str:
        """Absolute URI of ``key``."""
        return f"{self.root_uri.rstrip('/')}/{_check_key(key)}"

    def put_file(self, local: Path, key: str, kind: ArtifactKind, *, folder: str = "") -> Artifact:
        """Store a local file completely, then describe it.

        The artifact's ``key`` is relative to ``folder`` (the profile folder).
        """
        local = Path(local)
        digest = sha256_file(local)
        size = local.stat().st_size
        self._put_file(local, _check_key(key))
        return self._artifact(kind, key, folder, size, digest)

    def put_bytes(
        self, data: bytes, key: str, kind: ArtifactKind, *, folder: str = "", if_absent: bool = False
    ) -> Artifact:
        """Store ``data`` completely, then describe it (``key`` relative to ``folder``).

        ``if_absent``: never replace an existing object; :class:`AlreadyExistsError` instead.
        """
        if if_absent:
            self._put_new(data, _check_key(key))
        else:
            self._put_bytes(data, _check_key(key))
        return self._artifact(kind, key, folder, len(data), hashlib.sha256(data).hexdigest())

    def _artifact(self, kind: ArtifactKind, key: str, folder: str, size: int, digest: str) -> Artifact:
        relative = key[len(folder) + 1 :] if folder and key.startswith(folder + "/") else key
        return Artifact(kind=kind, key=relative, uri=self.uri(key), bytes=size, sha256=digest)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object; :class:`StorageError` if absent."""
        return self._get_bytes(_check_key(key))

    def download(self, key: str, dest: Path, expected_sha256: str | None = None) -> Path:
        """Fetch ``key`` to ``dest`` (temp name + rename), verifying its sha256 when given.

        The key is checked before anything is created: a bad key leaves no folder behind.
        """
        key = _check_key(key)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            self._download(key, tmp)
            if expected_sha256 is not None:
                actual = sha256_file(tmp)
                if actual != expected_sha256:
                    raise IntegrityError(f"{self.uri(key)}: sha256 {actual} does not match the manifest's {expected_sha256}")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is fully stored."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (relative to the root), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    def delete_tree(self, prefix: str) -> None:
        """Remove every key under the folder ``prefix``, its manifest first: a half-deleted
        profile is never one that looks complete."""
        keys = self.list(_check_key(prefix) + "/")
        for key in sorted(keys, key=lambda k: not k.endswith("/" + MANIFEST_NAME)):
            self.delete(key)

    @abc.abstractmethod
    def _put_file(self, local: Path, key: str) -> None: ...

    @abc.abstractmethod
    def _put_bytes(self, data: bytes, key: str) -> None: ...

    @abc.abstractmethod
    def _put_new(self, data: bytes, key: str) -> None: ...

    @abc.abstractmethod
    def _get_bytes(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _download(self, key: str, dest: Path) -> None: ...


class FileStorage(Storage):
    """A folder on a filesystem every node mounts (e.g. /mnt/cluster_storage)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root_uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write_atomically(self, key: str, write: Callable[[Path], None]) -> None:
        dest = self._path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
            try:
                write(tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"cannot write {dest}: {e}") from e

    def _put_file(self, local: Path, key: str) -> None:
        self._write_atomically(key, lambda tmp: shutil.copyfile(local, tmp))

    def _put_bytes(self, data: bytes, key: str) -> None:
        self._write_atomically(key, lambda tmp: tmp.write_bytes(data))

    def _put_new(self, data: bytes, key: str) -> None:
        dest = self._path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    os.fsync(f.fileno())
                # link() fails if dest exists, where rename() would replace it.
                os.link(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
        except FileExistsError:
            raise AlreadyExistsError(f"{self.uri(key)} already exists; not replaced") from None
        except OSError as e:
            raise StorageError(f"cannot write {dest}: {e}") from e

    def _get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            raise StorageError(f"cannot read {self.uri(key)}: {e}") from e

    def _download(self, key: str, dest: Path) -> None:
        try:
            shutil.copyfile(self._path(key), dest)
        except OSError as e:
            raise StorageError(f"cannot read {self.uri(key)}: {e}") from e

    def exists(self, key: str) -> bool:
        path = self._path(_check_key(key))
        try:
            path.stat()
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StorageError(f"cannot stat {self.uri(key)}: {e}") from e
        return path.is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix if prefix else self.root
        try:
            if not base.exists():
                return []
            return sorted(
                p.relative_to(self.root).as_posix()
                for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )
        except OSError as e:
            raise StorageError(f"cannot list {base}: {e}") from e

    def delete(self, key: str) -> None:
        try:
            self._path(_check_key(key)).unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"cannot delete {self.uri(key)}: {e}") from e


class MemoryStorage(Storage):
    """A dict, for unit tests that need no filesystem or network."""

    def __init__(self, root_uri: str = "memory://rayprof") -> None:
        self.root_uri = root_uri
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _put_file(self, local: Path, key: str) -> None:
        self._put_bytes(Path(local).read_bytes(), key)

    def _put_bytes(self, data: bytes, key: str) -> None:
        with self._lock:
            self.objects[key] = bytes(data)

    def _put_new(self, data: bytes, key: str) -> None:
        with self._lock:
            if key in self.objects:
                raise AlreadyExistsError(f"{self.uri(key)} already exists; not replaced")
            self.objects[key] = bytes(data)

    def _get_bytes(self, key: str) -> bytes:
        with self._lock:
            try:
                return self.objects[key]
            except KeyError:
                raise StorageError(f"{self.uri(key)} does not exist") from None

    def _download(self, key: str, dest: Path) -> None:
        dest.write_bytes(self._get_bytes(key))

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self.objects

    def list(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(k for k in self.objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)


class S3Storage(Storage):
    """``s3://bucket/prefix`` on AWS S3 or any S3-compatible server (MinIO via ``endpoint_url``).

    Credentials come only from the standard AWS chain (env, shared files, instance
    role); they are never part of a :class:`StorageSpec` and never logged.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        retries: int | None = None,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.root_uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.retries = env_int(UPLOAD_RETRIES_ENV_VAR, DEFAULT_UPLOAD_RETRIES) if retries is None else retries
        # One client per storage object: boto3 clients are thread-safe and costly to build.
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region or "us-east-1",
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
                s3={"addressing_style": "path"} if endpoint_url else None,
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD_BYTES, multipart_chunksize=MULTIPART_THRESHOLD_BYTES
        )

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        from botocore.exceptions import BotoCoreError, ClientError

        # Backoff 0.5, 1, 2, 4 s...: five attempts ride out ~7 s of outage.
        delay = 0.5
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except ClientError as e:
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status < 500 or attempt == self.retries:
                    raise StorageError(f"{what}: {e}") from e
            except (BotoCoreError, OSError) as e:
                if attempt == self.retries:
                    raise StorageError(f"{what} failed after {attempt} attempts: {e}") from e
            logger.warning("%s: attempt %d/%d failed, retrying in %.1fs", what, attempt, self.retries, delay)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
        raise AssertionError("unreachable")

    def _put_file(self, local: Path, key: str) -> None:
        self._retrying(
            f"upload {self.uri(key)}",
            lambda: self._client.upload_file(str(local), self.bucket, self._object_key(key), Config=self._transfer),
        )

    def _put_bytes(self, data: bytes, key: str) -> None:
        self._retrying(
            f"upload {self.uri(key)}",
            lambda: self._client.put_object(Bucket=self.bucket, Key=self._object_key(key), Body=data),
        )

    def _put_new(self, data: bytes, key: str) -> None:
        # S3's conditional write: the PUT fails with 412 when the key exists.
        try:
            self._retrying(
                f"upload {self.uri(key)}",
                lambda: self._client.put_object(
                    Bucket=self.bucket, Key=self._object_key(key), Body=data, IfNoneMatch="*"
                ),
            )
        except StorageError as e:
            cause = e.__cause__
            status = getattr(cause, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):
                raise AlreadyExistsError(f"{self.uri(key)} already exists; not replaced") from cause
            raise

    def _get_bytes(self, key: str) -> bytes:
        return self._retrying(
            f"read {self.uri(key)}",
            lambda: self._client.get_object(Bucket=self.bucket, Key=self._object_key(key))["Body"].read(),
        )

    def _download(self, key: str, dest: Path) -> None:
        self._retrying(
            f"download {self.uri(key)}",
            lambda: self._client.download_file(self.bucket, self._object_key(key), str(dest), Config=self._transfer),
        )

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._object_key(_check_key(key)))
                return True
            except ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return False
                raise

        return self._retrying(f"stat {self.uri(key)}", head)

    def list(self, prefix: str) -> list[str]:
        full = self._object_key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0

        def pages() -> list[str]:
            keys: list[str] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return keys

        return sorted(self._retrying(f"list {self.root_uri}/{prefix}", pages))

    def delete(self, key: str) -> None:
        self._retrying(
            f"delete {self.uri(key)}",
            lambda: self._client.delete_object(Bucket=self.bucket, Key=self._object_key(_check_key(key))),
        )


@functools.lru_cache(maxsize=16)
def open_storage(spec: StorageSpec) -> Storage:
    """The storage a spec names; cached so each process keeps one S3 client per root."""
    uri = normalize_uri(spec.uri)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return S3Storage(
            parsed.netloc, parsed.path.lstrip("/"), endpoint_url=spec.s3_endpoint_url, region=spec.s3_region
        )
    return FileStorage(parsed.path)
