"""The real FastAPI app of the service, in process and without Ray or Serve, in front of the
real ``Controller`` class (fake agents register with it): routes, guards and headers as deployed.

Serve's class-based ingress finds the route's ``self`` through the replica context; here
that context is one stand-in object holding the service instance.
"""

from __future__ import annotations

import types
from typing import Any

import httpx
import pytest
from ray import serve

from actors.controller.actor import Controller
from orchestrator.service import app as service_app

BASE_URL = "http://127.0.0.1:8000"


class _Method:
    def __init__(self, controller: Controller, name: str) -> None:
        self._controller, self._name = controller, name

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self._controller, self._name)(*args, **kwargs)


class ActorLike:
    """A controller reached as through a Ray handle: ``handle.method.remote(...)`` is awaitable."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._controller, name)


def install_service(
    monkeypatch: pytest.MonkeyPatch, controller: Controller, handle: ActorLike | None = None, **options: Any
) -> Any:
    """The real app (an ASGI app), served by a ``ProfilingService`` built with ``options``
    that reaches ``controller`` through ``handle`` (default: an ``ActorLike``)."""
    cls = service_app.ProfilingService.func_or_class.__mro__[1]  # the class under Serve's ingress wrapper
    instance = cls.__new__(cls)
    cls.__init__(instance, controller=handle or ActorLike(controller), **options)
    monkeypatch.setattr(serve, "get_replica_context", lambda: types.SimpleNamespace(servable_object=instance))
    return service_app.api


def service_client(monkeypatch: pytest.MonkeyPatch, controller: Controller, **options: Any) -> httpx.AsyncClient:
    """An HTTP client of the real app, served by a ``ProfilingService`` built with ``options``."""
    transport = httpx.ASGITransport(app=install_service(monkeypatch, controller, **options), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL)
