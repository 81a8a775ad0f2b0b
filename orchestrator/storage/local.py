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
        path = self._path(check_key(key))
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

    def folders(self, prefix: str) -> list[str]:
        base = self.root / check_key(prefix) if prefix else self.root
        try:
            if not base.is_dir():
                return []
            return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError as e:
            raise StorageError(f"cannot list {base}: {e}") from e

    def delete(self, key: str) -> None:
        try:
            self._path(check_key(key)).unlink(missing_ok=True)
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
