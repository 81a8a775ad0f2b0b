"""What the HTTP service does before and around its routes: body limit, auth,
Host allow-list, security headers, and error bodies that leak nothing.

Kept apart from :mod:`orchestrator.service.app` so the routes stay thin.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.auth import allowed_hosts, host_of
from orchestrator.errors import (
    ForbiddenError,
    InvalidRequestError,
    RayprofError,
)
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR

__all__ = [
    "FRAMED_REPORT_CSP",
    "MAX_BODY_BYTES",
    "REPORT_CSP",
    "REPORT_HEADERS",
    "BodyLimit",
    "Guard",
    "SecurityHeaders",
    "error_response",
    "rayprof_error_response",
    "serve_http_host",
    "unexpected_error_response",
]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
"""Request bodies above this are refused with 413: a profile request is a few hundred bytes."""

# report.html is inline CSS and SVG only: nothing may load, run or submit. The two policies
# differ only in who may frame it: served at its own URL (/report) nothing may; the
# console shows it in a sandboxed frame of its own origin, so that origin may, and the
# frame keeps that origin (allow-same-origin, never allow-scripts: no script runs in it)
# so the console can read its height and show all of it rather than a scrolled slice.
_REPORT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
REPORT_CSP = f"{_REPORT_POLICY}; frame-ancestors 'none'; sandbox"
FRAMED_REPORT_CSP = f"{_REPORT_POLICY}; frame-ancestors 'self'; sandbox allow-same-origin"
REPORT_HEADERS = {
    "content-security-policy": REPORT_CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
# Every response: no MIME sniffing, never inside a frame (the /docs page still loads its scripts).
_DEFAULT_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
)


def error_response(status: int, code: str, detail: str) -> JSONResponse:
    """Every error body: ``{"error": code, "detail": message}``."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def rayprof_error_response(request: Request, exc: RayprofError) -> JSONResponse:
    """A rayprof error as its status and code; server-side details only in the log."""
    if not exc.message_shown:
        return _hidden(request, exc, exc.http_status, exc.code)
    return error_response(exc.http_status, exc.code, exc.message)


def unexpected_error_response(request: Request, exc: Exception) -> JSONResponse:
    """A bug or a library's error: a generic 500 with an id to find the logged traceback by."""
    return _hidden(request, exc, 500, "internal_error")


def _hidden(request: Request, exc: Exception, status: int, code: str) -> JSONResponse:
    error_id = uuid.uuid4().hex[:16]
    logger.error(
        "rayprof error %s on %s %s: %s", error_id, request.method, request.url.path, code, exc_info=exc
    )
    detail = f"the rayprof service failed ({code}); error id {error_id} is in the service log"
    return JSONResponse({"error": code, "detail": detail, "error_id": error_id}, status_code=status)


# What the link-signing key is derived for: a key made for one purpose is never the token itself.
_LINK_KEY_LABEL = b"rayprof artifact links v1"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def link_key(token: str) -> bytes:
    """The key that signs artifact URLs, derived from the token with a purpose label.

    scrypt (once per replica, ~50 ms) so that a signed link, which anyone who sees
    it holds, costs an offline guesser that much per guess of the token.
    """
    return hashlib.scrypt(token.encode(), salt=_LINK_KEY_LABEL, n=2**14, r=8, p=1, dklen=32)


class Guard:
    """Bearer-token check, the Host allow-list of a service that has no token, and
    the refusal of requests another web site's page makes.

    A browser on a machine that can reach the service can be made to send it
    requests under an attacker's host name (DNS rebinding). With a token the
    attacker's page cannot authenticate; without one, only requests whose
    ``Host`` is loopback or explicitly allowed are answered. A page of another
    site can still make the browser send a request to the service's own name (a
    form, an image): the browser says so in ``Origin`` (and ``Sec-Fetch-Site``),
    and such requests are refused with 403 whether or not there is a token.
    """

    def __init__(self, token: str | None, extra_hosts: list[str] | tuple[str, ...] = ()) -> None:
        self._token = token.encode() if token is not None else None
        self._link_key = link_key(token) if token is not None else None
        self._hosts = allowed_hosts(extra_hosts)

    @property
    def has_token(self) -> bool:
        return self._token is not None

    @property
    def link_key(self) -> bytes | None:
        """The key for signing URLs a browser follows without a header; ``None`` without a token."""
        return self._link_key

    def check_origin(self, request: Request) -> None:
        """Refuse a request that a page of another site made the browser send."""
        origin = request.headers.get("origin")
        if origin is not None:
            # Behind a proxy the browser's Host may arrive as X-Forwarded-Host; a page of another
            # site cannot set either header on a request it makes the browser send.
            hosts = (request.headers.get("host", ""), request.headers.get("x-forwarded-host", ""))
            if self._own_origin(origin, hosts):
                return
            shown = origin[:100]
            raise ForbiddenError(
                f"requests from the web page at {shown!r} are refused: only this service's own pages "
                "(and the hosts it allows) may call it from a browser"
            )
        fetch_site = request.headers.get("sec-fetch-site")
        if fetch_site == "cross-site" and request.method not in _SAFE_METHODS:
            raise ForbiddenError("a request that another web site's page sent is refused")

    def _own_origin(self, origin: str, host_headers: tuple[str, ...]) -> bool:
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file) or garbage
        if parts.netloc.lower() in {h.strip().lower() for h in host_headers if h.strip()}:
            return True
        return host_of(parts.netloc) in self._hosts

    def check(self, request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
        self.check_origin(request)
        if self._token is not None:
            given = credentials.credentials.encode() if credentials is not None else b""
            if not hmac.compare_digest(given, self._token):
                raise HTTPException(401, "missing or wrong bearer token")
            return
        host = host_of(request.headers.get("host", ""))
        if "*" not in self._hosts and host not in self._hosts:
            shown = host[:100] or "(none)"
            raise InvalidRequestError(
                f"Host {shown!r} is not allowed: a service without a token answers only loopback names "
                f"and those in {ALLOWED_HOSTS_ENV_VAR}"
            )


class SecurityHeaders:
    """ASGI middleware: the default security headers on every response that has none of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in _DEFAULT_HEADERS if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: answer 413 for bodies over ``max_bytes``, declared or streamed.

    A declared ``content-length`` is refused before reading; a chunked body is
    read up to the limit and replayed to the app, so no handler ever sees more.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read_body(receive)
        except _BodyTooLarge:
            await self._refuse(send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": "body_too_large", "detail": f"request body over {self.max_bytes} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def serve_http_host() -> str | None:
    """The address Serve's proxies bind, as its controller has it; ``None`` when no Serve runs here.

    Asked at app build time (``serve deploy``/``serve run`` build the app in the
    cluster after applying ``http_options``) and when a replica starts.
    """
    import ray

    if not ray.is_initialized():
        return None
    # Serve has no public call for its HTTP options; its controller answers this one.
    from orchestrator.ray_compat import serve_controller

    try:
        controller: Any = serve_controller()
    except ValueError:
        return None
    return ray.get(controller.get_http_config.remote(), timeout=30).host
