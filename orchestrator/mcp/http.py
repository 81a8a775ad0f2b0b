"""The MCP server on the HTTP service's ``/mcp`` route (the streamable HTTP transport).

The route checks the token, Host and Origin as every API route does
(:class:`orchestrator.service.security.Guard`), then hands the request to
:class:`McpEndpoint`: stateless, so any replica answers any request and nothing
is kept between them, with plain JSON answers, one body per call, that Serve's
proxy forwards as they are. The SDK's own Host check is off: the guard's rules
(loopback or ``RAYPROF_ALLOWED_HOSTS`` without a token, any Host with one) are the
service's, and one set of rules is what an operator configures.
"""

from __future__ import annotations

import asyncio

import anyio
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from orchestrator.mcp.server import build_server
from orchestrator.mcp.tools import ClientSource

__all__ = ["McpEndpoint", "McpResponse"]

_START_TIMEOUT_S = 10.0


class McpEndpoint:
    """An ASGI app answering MCP requests; its session manager runs in a task of the first
    request's event loop (a Serve replica's), started on that request."""

    def __init__(self, client: ClientSource, *, read_only: bool = False, version: str = "") -> None:
        server = build_server(client, read_only=read_only, version=version)
        # Builds the session manager; the Starlette app it returns is not used (the service routes).
        server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = server.session_manager
        self._started: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    async def _run(self, started: asyncio.Event) -> None:
        async with self._manager.run():
            started.set()
            await anyio.sleep_forever()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._started is None:
            self._started = asyncio.Event()
            self._runner = asyncio.get_running_loop().create_task(self._run(self._started))
        await asyncio.wait_for(self._started.wait(), _START_TIMEOUT_S)
        await self._manager.handle_request(scope, receive, send)


class McpResponse(Response):
    """What a FastAPI route returns to let :class:`McpEndpoint` answer its request itself."""

    def __init__(self, endpoint: McpEndpoint, request: Request) -> None:
        super().__init__()
        self._endpoint = endpoint
        self._receive = request.receive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._endpoint(scope, self._receive, send)
