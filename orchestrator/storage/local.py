"""Cluster storage (a shared path) and an in-memory store for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import AlreadyExistsError, StorageError
from orchestrator.storage.base import Storage, check_key


class FileStorage(Storage):
    """A folder on a filesystem every node mounts (e.g. /mnt/cluster_storage).

    Symbolic links are never followed out of the root: a read or write whose path
    leaves it is refused, listings do not enter or show links, and a delete never
    goes through one (a planted link once made gc delete files elsewhere). A
    delete removes the folders it empties, up to the root.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root_uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        path = self.root / key
        if not path.resolve().is_relative_to(self.root):
            raise StorageError(f"{self.uri(key)} leads out of the storage root through a symbolic link; refused")
        return path

    def _through_link(self, path: Path) -> bool:
        """Whether any folder or file between the root and ``path`` is a symbolic link."""
        at = self.root
        for part in path.relative_to(self.root).parts:
            at = at / part
            if at.is_symlink():
                return True
        return False

    def _write_atomically(self, key: str, write: Callable[[Path], None], *, replace: bool = True) -> None:
        """Write through a temporary file beside the key, synced, then publish it under the key: over any old file
        (``replace``), or only where none is (a hard link, which fails where rename would replace):
        :class:`AlreadyExistsError` then, and the old file stays."""
        dest = self._path(key)
        try:
            for attempt in range(3):
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
                try:
                    write(tmp)
                    with open(tmp, "rb+") as f:
                        os.fsync(f.fileno())
                    if replace:
                        os.replace(tmp, dest)
                    else:
                        try:
                            os.link(tmp, dest)
                        except FileExistsError:
                            raise AlreadyExistsError(f"{self.uri(key)} already exists; not replaced") from None
                    return
                except FileNotFoundError:
                    # A delete emptied and removed the folder between mkdir and the write: make it again.
                    if attempt == 2:
                        raise
                finally:
                    tmp.unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"cannot write {dest}: {e}") from e

    def _put_file(self, local: Path, key: str) -> None:
        self._write_atomically(key, lambda tmp: shutil.copyfile(local, tmp))

    def _put_bytes(self, data: bytes, key: str) -> None:
        self._write_atomically(key, lambda tmp: tmp.write_bytes(data))

    def _put_new(self, data: bytes, key: str) -> None:
        self._write_atomically(key, lambda tmp: tmp.write_bytes(data), replace=False)

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
        path = self._path(check_key(key))
        try:
            path.stat()
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StorageError(f"cannot stat {self.uri(key)}: {e}") from e
        return path.is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.root / check_key(prefix.rstrip("/")) if prefix.rstrip("/") else self.root
        try:
            if not base.is_dir() or self._through_link(base):
                return []
            found = []
            # followlinks=False: a linked folder is listed as a name only and never entered.
            for folder, _, files in os.walk(base, followlinks=False):
                for name in files:
                    path = Path(folder, name)
                    if not name.startswith(".") and not path.is_symlink():
                        found.append(path.relative_to(self.root).as_posix())
            return sorted(found)
        except OSError as e:
            raise StorageError(f"cannot list {base}: {e}") from e

    def folders(self, prefix: str) -> list[str]:
        base = self.root / check_key(prefix) if prefix else self.root
        try:
            if not base.is_dir() or self._through_link(base):
                return []
            return sorted(
                p.name for p in base.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
            )
        except OSError as e:
            raise StorageError(f"cannot list {base}: {e}") from e

    def delete(self, key: str) -> None:
        """Remove ``key`` (a link there is removed, never what it points to), then every folder
        above it that is left empty, up to the root."""
        path = self.root / check_key(key)
        try:
            if self._through_link(path.parent):
                raise StorageError(f"{self.uri(key)} is reached through a symbolic link; not deleted")
            path.unlink(missing_ok=True)
            for folder in path.parents:
                if folder == self.root:
                    break
                try:
                    folder.rmdir()
                except OSError:
                    break  # not empty (or gone): what is above it is not empty either
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

    def folders(self, prefix: str) -> list[str]:
        start = f"{prefix}/" if prefix else ""
        with self._lock:
            return sorted({k[len(start) :].split("/")[0] for k in self.objects if k.startswith(start) and "/" in k[len(start) :]})

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)
