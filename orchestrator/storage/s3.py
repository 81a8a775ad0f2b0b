"""S3-compatible object storage (AWS S3, MinIO), with retries on every call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from orchestrator.errors import AlreadyExistsError, StorageError
from orchestrator.settings import (
    DEFAULT_UPLOAD_RETRIES,
    MULTIPART_THRESHOLD_BYTES,
    UPLOAD_RETRIES_ENV_VAR,
    env_int,
)
from orchestrator.storage.base import Storage, check_key

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
                self._client.head_object(Bucket=self.bucket, Key=self._object_key(check_key(key)))
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

    def folders(self, prefix: str) -> list[str]:
        full = f"{self._object_key(prefix)}/" if prefix else (f"{self.prefix}/" if self.prefix else "")

        def pages() -> list[str]:
            names: list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
                names.extend(p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", []))
            return names

        return sorted(self._retrying(f"list folders of {self.root_uri}/{prefix}", pages))

    def delete(self, key: str) -> None:
        self._retrying(
            f"delete {self.uri(key)}",
            lambda: self._client.delete_object(Bucket=self.bucket, Key=self._object_key(check_key(key))),
        )
