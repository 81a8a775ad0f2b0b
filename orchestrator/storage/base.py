"""The storage interface: all-or-nothing writes that return an Artifact with size and sha256.

Keys come from :mod:`orchestrator.layout`; a profile's files are written through
:meth:`Storage.scoped`, whose keys are relative to the profile's folder as the
manifest lists them, so no caller joins a folder and a name by hand.
"""

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

    def scoped(self, folder: str) -> Storage:
        """This storage seen from ``folder`` (a profile's, from :mod:`orchestrator.layout`): its keys,
        and the keys of the artifacts it describes, are relative to that folder."""
        return ScopedStorage(self, folder)

    def put_file(self, local: Path, key: str, kind: ArtifactKind) -> Artifact:
        """Store a local file completely, then describe it (its ``key`` as given: relative to this root)."""
        local = Path(local)
        digest = sha256_file(local)
        size = local.stat().st_size
        self._put_file(local, check_key(key))
        return Artifact(kind=kind, key=key, uri=self.uri(key), bytes=size, sha256=digest)

    def put_bytes(self, data: bytes, key: str, kind: ArtifactKind, *, if_absent: bool = False) -> Artifact:
        """Store ``data`` completely, then describe it.

        ``if_absent``: never replace an existing object; :class:`AlreadyExistsError` instead.
        """
        self.put_state(data, key, if_absent=if_absent)
        return Artifact(kind=kind, key=key, uri=self.uri(key), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    def put_state(self, data: bytes, key: str, *, if_absent: bool = False) -> None:
        """Store the controller's own state (a saved profile, an index, a lease...) completely.

        The same bytes as :meth:`put_bytes` would write, but no artifact: state is listed in no
        manifest, so it has no kind and needs no checksum.
        """
        if if_absent:
            self._put_new(data, check_key(key))
        else:
            self._put_bytes(data, check_key(key))

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


class ScopedStorage(Storage):
    """The keys under one folder of another storage, addressed relative to it: the one place a
    folder and a key under it are joined."""

    def __init__(self, inner: Storage, folder: str) -> None:
        self._inner = inner
        self.folder = check_key(folder)
        self.root_uri = inner.uri(self.folder)

    def _key(self, key: str) -> str:
        return f"{self.folder}/{key}"

    def scoped(self, folder: str) -> Storage:
        return ScopedStorage(self._inner, self._key(check_key(folder)))

    def exists(self, key: str) -> bool:
        return self._inner.exists(self._key(check_key(key)))

    def folders(self, prefix: str) -> list[str]:
        return self._inner.folders(self._key(check_key(prefix)) if prefix else self.folder)

    def list(self, prefix: str) -> list[str]:
        start = self._key("")
        return [k[len(start) :] for k in self._inner.list(start + prefix)]

    def delete(self, key: str) -> None:
        self._inner.delete(self._key(check_key(key)))

    def _put_file(self, local: Path, key: str) -> None:
        self._inner._put_file(local, self._key(key))

    def _put_bytes(self, data: bytes, key: str) -> None:
        self._inner._put_bytes(data, self._key(key))

    def _put_new(self, data: bytes, key: str) -> None:
        self._inner._put_new(data, self._key(key))

    def _get_bytes(self, key: str) -> bytes:
        return self._inner._get_bytes(self._key(key))

    def _download(self, key: str, dest: Path) -> None:
        self._inner._download(key=self._key(key), dest=dest)
