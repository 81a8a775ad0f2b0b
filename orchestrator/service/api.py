"""The FastAPI app behind the HTTP service: its schema metadata, middleware, error handlers
and the parameter types its routes share. :mod:`orchestrator.service.app` adds the routes.
"""

# No ``from __future__ import annotations``: FastAPI must resolve these annotations at import.
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.errors import RayprofError, validation_problems
from orchestrator.models.common import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    IDEMPOTENCY_KEY_PATTERN,
    NAME_MAX_LENGTH,
    NAME_PATTERN,
)
from orchestrator.service.console import router as console_router
from orchestrator.service.docs import router as docs_router
from orchestrator.service.security import (
    MAX_BODY_BYTES,
    BodyLimit,
    SecurityHeaders,
    error_response,
    rayprof_error_response,
    unexpected_error_response,
)
from orchestrator.service.views import ErrorBody
from orchestrator.settings import TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR

__all__ = ["ERROR_RESPONSES", "Credentials", "IdempotencyKeyHeader", "ProfileId", "api"]

# Checked here too so a bad id is a 422, not a controller round trip.
ProfileId = Annotated[str, Path(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Retry-safe submit: the same key with the same request returns the first profile "
        "(kept 24 h); with another request it is a 422.",
    ),
]


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A value the server refuses, or a Host not allowed without a token."},
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    403: {"model": ErrorBody, "description": "Sent by a page of another web site (its Origin is not this service's)."},
    404: {"model": ErrorBody, "description": "Unknown target, profile or watch."},
    409: {
        "model": ErrorBody,
        "description": "A window already runs on the target (conflict), or an object that must not be replaced exists.",
    },
    422: {"model": ErrorBody, "description": "Malformed body, unknown field, invalid name, or a reused Idempotency-Key."},
    500: {"model": ErrorBody, "description": "A server fault: a generic message and an error id, details in the log."},
    502: {"model": ErrorBody, "description": "Reading or writing storage failed (a generic message and an error id)."},
    503: {
        "model": ErrorBody,
        "description": "The control actor is unavailable, still restoring its saved state (restoring), "
        "or another live cluster holds its cluster name (cluster_name_in_use).",
    },
    504: {"model": ErrorBody, "description": "Waiting for a profile ran out of time."},
}
"""Every HTTP status a rayprof error (:mod:`orchestrator.errors`) is answered with; a test checks each is here."""


api = FastAPI(
    title="rayprof",
    version="1",
    description="On-demand torch.profiler windows on live Ray Train runs.",
    # FastAPI's pages load Swagger UI and ReDoc from a CDN: /docs is served from shipped files
    # (orchestrator.service.docs), and the schema behind the guard (ProfilingService.openapi_schema).
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
    responses=ERROR_RESPONSES,
)
api.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
api.include_router(console_router)
api.include_router(docs_router)
api.add_middleware(SecurityHeaders)
_bearer = HTTPBearer(
    auto_error=False, description=f"Required when the service has a token ({TOKEN_ENV_VAR} or {TOKEN_FILE_ENV_VAR})."
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


@api.exception_handler(RayprofError)
async def _rayprof_error(request: Request, exc: RayprofError) -> JSONResponse:
    return rayprof_error_response(request, exc)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = validation_problems(exc.errors())
    if any(e.get("type") == "extra_forbidden" for e in exc.errors()):
        # A client leaves out fields at their defaults (orchestrator.client.http), so an unknown one was asked for.
        detail += " (a field this service does not know: misspelt, or an option of a newer rayprof than the service's)"
    return error_response(422, "validation_error", detail)


@api.exception_handler(Exception)
async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return unexpected_error_response(request, exc)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    codes = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}
    return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))
