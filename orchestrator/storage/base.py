"""The storage interface: all-or-nothing writes that return an Artifact with size and sha256."""

from __future__ import annotations

import abc
import hashlib
import os
import uuid
from pathlib import Path

from orchestrator.errors import IntegrityError, StorageError
from orchestrator.layout import MANIFEST_NAME
from orchestrator.models.profile import Artifact, ArtifactKind

_CHUNK = 1024 * 1024


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_key(key: str) -> str:
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
        return f"{self.root_uri.rstrip('/')}/{check_key(key)}"

    def put_file(self, local: Path, key: str, kind: ArtifactKind, *, folder: str = "") -> Artifact:
        """Store a local file completely, then describe it.

        The artifact's ``key`` is relative to ``folder`` (the profile folder).
        """
        local = Path(local)
        digest = sha256_file(local)
        size = local.stat().st_size
        self._put_file(local, check_key(key))
        return self._artifact(kind, key, folder, size, digest)

    def put_bytes(
        self, data: bytes, key: str, kind: ArtifactKind, *, folder: str = "", if_absent: bool = False
    ) -> Artifact:
        """Store ``data`` completely, then describe it (``key`` relative to ``folder``).

        ``if_absent``: never replace an existing object; :class:`AlreadyExistsError` instead.
        """
        if if_absent:
            self._put_new(data, check_key(key))
        else:
            self._put_bytes(data, check_key(key))
        return self._artifact(kind, key, folder, len(data), hashlib.sha256(data).hexdigest())

    def _artifact(self, kind: ArtifactKind, key: str, folder: str, size: int, digest: str) -> Artifact:
        relative = key[len(folder) + 1 :] if folder and key.startswith(folder + "/") else key
        return Artifact(kind=kind, key=relative, uri=self.uri(key), bytes=size, sha256=digest)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object; :class:`StorageError` if absent."""
        return self._get_bytes(check_key(key))

    def download(self, key: str, dest: Path, expected_sha256: str | None = None) -> Path:
        """Fetch ``key`` to ``dest`` (temp name + rename), verifying its sha256 when given.

        The key is checked before anything is created: a bad key leaves no folder behind.
        """
        key = check_key(key)
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
    def folders(self, prefix: str) -> list[str]:
        """Names of the folders directly under ``prefix`` ("" for the root), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    def delete_tree(self, prefix: str) -> None:
        """Remove every key under the folder ``prefix``, its manifest first: a half-deleted
        profile is never one that looks complete."""
        keys = self.list(check_key(prefix) + "/")
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
