"""``HttpBackend``: the client's HTTP transport of :class:`~orchestrator.models.api.ProfilingApi`.

``ProfilingClient("http://127.0.0.1:8000", token)`` uses it. Each operation goes out as its entry in
:data:`orchestrator.client.routes.ROUTES` says; none is written here. Error bodies
``{"error": code, "detail": message}`` come back as the same exception classes
the in-cluster client raises (``TargetNotFoundError``, ``ConflictError``, ...).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from orchestrator import errors
from orchestrator.auth import is_http_url
from orchestrator.client.routes import ANSWER, ROUTES
from orchestrator.errors import (
    ControllerUnavailableError,
    InvalidRequestError,
    RayprofError,
    UnauthorizedError,
)
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.api import bind, call_timeout
from orchestrator.models.common import read_lenient
from orchestrator.settings import DEFAULT_URL, S3_ENDPOINT_URL_ENV_VAR, S3_REGION_ENV_VAR

if TYPE_CHECKING:
    # typing.Self is 3.11's; typing_extensions (pydantic's dependency) has it for 3.10, for the type checker only.
    from typing_extensions import Self

    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["HttpBackend", "error_for"]

DEFAULT_TIMEOUT_S = 30.0


def _json(value: Any) -> Any:
    """An argument as JSON (a model as it dumps itself, an enum as its value).

    A request leaves out the fields at their defaults, which the service fills in as its own: a client may run a
    newer rayprof than the service as long as the caller uses no option the service's release lacks.
    """
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    return to_jsonable_python(value)


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
        # "localhost:8000" parses as scheme "localhost", and httpx refuses a host it cannot encode: both said as
        # what they are, a usage error, not an unreachable service.
        refused = f"service URL {url!r} is not an http(s) URL: use http://HOST:PORT, e.g. {DEFAULT_URL}"
        if not is_http_url(url):
            raise InvalidRequestError(refused)
        try:
            self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)
        except httpx.InvalidURL as e:
            raise InvalidRequestError(f"{refused} ({e})") from None
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

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``name(*args, **kwargs)`` as the request its route describes; the answer as the operation's result."""
        route = ROUTES.get(name)
        if route is None:
            raise InvalidRequestError(f"the operation {name!r} is the service's own: a client cannot send it over HTTP")
        arguments = bind(name, args, kwargs)
        if route.prepare is not None:
            arguments = route.prepare(arguments)
        path = route.path.format(**{f: quote(str(arguments[f]), safe="") for f in route.path_fields()})
        params = {q: _json(arguments[a]) for q, a in route.query.items() if arguments[a] is not None}
        headers = {h: str(arguments[a]) for h, a in route.headers.items() if arguments[a] is not None}
        body: Any = None
        if isinstance(route.body, str):
            body = _json(arguments[route.body])
        elif route.body is not None:
            body = {a: _json(arguments[a]) for a in route.body}
        timeout = call_timeout(name, arguments, self._timeout_s)
        answer = self._request(route.method, path, params=params, json=body, headers=headers or None, timeout=timeout)
        result = route.answer(answer)
        if isinstance(result, StorageSpec):
            # The service's root with this client's endpoint: the service may reach S3/MinIO
            # under an address this machine cannot.
            result = result.model_copy(update={"s3_endpoint_url": self._s3_endpoint_url, "s3_region": self._s3_region})
        return result

    def diff(self, a: str, b: str) -> ProfileDiff:
        """Compared by the service, which reads both profiles from storage."""
        from orchestrator.analysis.diff import ProfileDiff

        path = f"/v1/profiles/{quote(a, safe='')}/diff/{quote(b, safe='')}"
        return read_lenient(ProfileDiff, self._request("GET", path), source=ANSWER)
