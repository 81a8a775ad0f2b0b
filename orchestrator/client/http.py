"""``HttpBackend``: the client's :class:`~orchestrator.client.Backend` over the HTTP API.

``ProfilingClient("http://127.0.0.1:8000", token)`` uses it. Error bodies
``{"error": code, "detail": message}`` come back as the same exception classes
the in-cluster client raises (``TargetNotFoundError``, ``ConflictError``, ...).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from orchestrator import errors
from orchestrator.errors import (
    ControllerUnavailableError,
    InvalidRequestError,
    RayprofError,
    UnauthorizedError,
)
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage
from orchestrator.settings import (
    MAX_HTTP_WAIT_S,
    S3_ENDPOINT_URL_ENV_VAR,
    S3_REGION_ENV_VAR,
)

if TYPE_CHECKING:
    # typing.Self is 3.11's; typing_extensions (pydantic's dependency) has it for 3.10, for the type checker only.
    from typing_extensions import Self

    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["HttpBackend", "error_for"]

DEFAULT_TIMEOUT_S = 30.0

# Fields the HTTP views add to a ProfileStatus (orchestrator.service.app.ProfileView).
_VIEW_ONLY_FIELDS = ("status_url", "manifest")


def _subclasses(cls: type[RayprofError]) -> list[type[RayprofError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


def error_for(status: int, code: str | None, detail: str) -> RayprofError:
    """The exception an error response stands for: by its ``code``, else by HTTP status."""
    by_code = {cls.code: cls for cls in _subclasses(RayprofError) if cls.__module__ == errors.__name__}
    cls = by_code.get(code or "")
    if cls is None:
        # Codes the API adds on its own (validation_error, body_too_large, ...).
        cls = {
            400: InvalidRequestError,
            401: UnauthorizedError,
            404: errors.NotFoundError,
            409: errors.ConflictError,
            413: InvalidRequestError,
            422: InvalidRequestError,
            503: ControllerUnavailableError,
        }.get(status, RayprofError)
    return cls(detail)


class HttpBackend:
    """Talks to the rayprof service; one pooled connection per client.

    Artifacts are fetched straight from storage (S3 or cluster storage), so a
    download needs the storage's endpoint: ``s3_endpoint_url`` or
    ``RAYPROF_S3_ENDPOINT_URL`` for MinIO.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        s3_endpoint_url: str | None = None,
        s3_region: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)
        self._timeout_s = timeout_s
        self._s3_endpoint_url = s3_endpoint_url or os.environ.get(S3_ENDPOINT_URL_ENV_VAR) or None
        self._s3_region = s3_region or os.environ.get(S3_REGION_ENV_VAR) or None

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, timeout=timeout or self._timeout_s, **kwargs)
        except httpx.TransportError as e:
            raise ControllerUnavailableError(f"cannot reach the rayprof service at {self.url}: {e}") from e
        if response.is_success:
            return response.json()
        try:
            body = response.json()
            code, detail = body.get("error"), str(body.get("detail", response.text))
        except ValueError:
            code, detail = None, response.text or response.reason_phrase
        raise error_for(response.status_code, code, detail)

    @staticmethod
    def _status(body: dict[str, Any]) -> ProfileStatus:
        return ProfileStatus.model_validate({k: v for k, v in body.items() if k not in _VIEW_ONLY_FIELDS})

    @staticmethod
    def _path(profile_id: str) -> str:
        return f"/v1/profiles/{quote(profile_id, safe='')}"

    def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        body = self._request("POST", "/v1/profiles", json=request.model_dump(mode="json"), headers=headers)
        return self._status(body)

    def get(self, profile_id: str) -> ProfileStatus:
        return self._status(self._request("GET", self._path(profile_id)))

    def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        wait_s = max(0.0, min(timeout_s, MAX_HTTP_WAIT_S))
        body = self._request("GET", self._path(profile_id), params={"wait_s": wait_s}, timeout=wait_s + self._timeout_s)
        return self._status(body)

    def list(self, target: str | None, state: ProfileState | None, limit: int, offset: int) -> ProfilePage:
        params: dict[str, str | int] = {"limit": limit, "offset": offset}
        params.update({k: v for k, v in (("target", target), ("state", state.value if state else None)) if v})
        return ProfilePage.model_validate(self._request("GET", "/v1/profiles", params=params))

    def delete(self, profile_id: str) -> None:
        self._request("DELETE", self._path(profile_id))

    def gc(self, request: GcRequest) -> GcReport:
        # Deleting many folders can take a while; never cut it short.
        body = self._request("POST", "/v1/gc", json=request.model_dump(mode="json"), timeout=600.0)
        return GcReport.model_validate(body)

    def cancel(self, profile_id: str) -> ProfileStatus:
        return self._status(self._request("DELETE", self._path(profile_id)))

    def manifest(self, profile_id: str) -> Manifest:
        return Manifest.model_validate(self._request("GET", f"{self._path(profile_id)}/manifest"))

    def targets(self) -> list[TargetInfo]:
        return TypeAdapter(list[TargetInfo]).validate_python(self._request("GET", "/v1/targets")["targets"])

    def history(
        self, target: str, run: str | None, span_s: float, ranks: list[int] | None, max_points: int
    ) -> TargetHistory:
        params: dict[str, Any] = {"span_s": span_s, "rank": ranks or [], "max_points": max_points}
        if run is not None:
            params["run"] = run
        body = self._request("GET", f"/v1/targets/{quote(target, safe='')}/history", params=params)
        return TargetHistory.model_validate(body)

    def storage(self) -> StorageSpec:
        # The service's root with this client's endpoint: the service may reach
        # S3/MinIO under an address this machine cannot.
        uri = self._request("GET", "/v1/storage")["uri"]
        return StorageSpec(uri=uri, s3_endpoint_url=self._s3_endpoint_url, s3_region=self._s3_region)

    def diff(self, a: str, b: str) -> ProfileDiff:
        from orchestrator.analysis.diff import ProfileDiff

        path = f"{self._path(a)}/diff/{quote(b, safe='')}"
        return ProfileDiff.model_validate(self._request("GET", path))

    def stacks(self, target: str, native: bool, run: str | None) -> StacksBundle:
        # A POST: taking stacks acts on every rank and stores a bundle.
        path = f"/v1/targets/{quote(target, safe='')}/stacks"
        body = self._request("POST", path, json={"native": native, "run": run}, timeout=self._timeout_s + 60)
        return StacksBundle.model_validate(body)

    def create_watch(self, spec: WatchSpec) -> WatchStatus:
        return WatchStatus.model_validate(self._request("POST", "/v1/watches", json=spec.model_dump(mode="json")))

    def get_watch(self, watch_id: str) -> WatchStatus:
        return WatchStatus.model_validate(self._request("GET", f"/v1/watches/{quote(watch_id, safe='')}"))

    def list_watches(self) -> list[WatchStatus]:
        return TypeAdapter(list[WatchStatus]).validate_python(self._request("GET", "/v1/watches")["watches"])

    def delete_watch(self, watch_id: str) -> None:
        self._request("DELETE", f"/v1/watches/{quote(watch_id, safe='')}")
