"""The service's link to the control actor: the one handle its routes call through, created (or found) by
name, checked to run this build, dropped when found gone and found again.

A detached controller outlives upgrades and may be replaced for good (``rayprof serve --replace-controller``):
the first call through each new handle checks the build it answers to ``ping``
(:func:`orchestrator.build.check_build`), and a repeatable call that finds its controller gone is sent
again at once to the actor that now holds the name, as the Python client's reads are
(:class:`orchestrator.client.ray_backend.ActorBackend`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, ParamSpec, TypeVar

from actors.controller.rpc import ControllerRpc, is_unreachable, ray_errors
from orchestrator.build import check_build
from orchestrator.errors import ControllerUnavailableError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.api import Operation, bind, call_timeout, repeatable
from orchestrator.models.api import ProfilingApi as Api

__all__ = ["CALL_TIMEOUT_S", "ControllerLink"]

P = ParamSpec("P")
R = TypeVar("R")

CALL_TIMEOUT_S = 30.0
"""How long one plain call to the control actor may take before the service answers 503 (longer ones
by their policy: :func:`orchestrator.models.api.call_timeout`)."""


class ControllerLink:
    """Calls to the control actor. ``storage``: where the named actor is told to store new profiles once
    connected; ``handle``: a control actor to use instead of the named one (pinned: never dropped)."""

    def __init__(self, storage: StorageSpec | None, handle: Any = None) -> None:
        self._storage = storage
        self._pinned = handle is not None
        self._rpc: ControllerRpc | None = ControllerRpc(handle) if handle is not None else None
        self._configured: Awaitable[None] | None = None
        # Whether the controller behind self._rpc answered ping with this build (checked once per handle).
        self._same_build = False

    @property
    def handle(self) -> Any | None:
        """The control actor's handle, None until connected."""
        return self._rpc.handle if self._rpc is not None else None

    def connect(self) -> ControllerRpc:
        """The named control actor, created if absent."""
        from actors.controller.actor import create_controller
        from orchestrator.config import controller_config

        self._rpc = ControllerRpc(create_controller(controller_config(self._storage)))
        self._same_build = False
        if self._storage is not None:
            # An actor that already existed keeps its old storage unless told; the
            # reply is awaited before the next call so errors are not lost.
            self._configured = self._rpc.remote(Api.configure, self._storage)
        return self._rpc

    async def ask(self, op: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """One call of ``op``, timed by the operation's policy; a repeatable one is sent again once to the actor
        that holds the name now when its controller was found gone."""
        arguments = bind(op.__name__, args, kwargs)
        timeout = call_timeout(op.__name__, arguments, CALL_TIMEOUT_S)
        tries = 2 if repeatable(op.__name__, arguments) else 1
        for attempt in range(tries):
            try:
                return await self._send(op, timeout, *args, **kwargs)
            except ControllerUnavailableError as e:
                if not is_unreachable(e) or self._pinned:
                    raise
                self._rpc = None  # the next call finds (or recreates) the named actor
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    async def _send(self, op: Operation[P, R], timeout: float, *args: P.args, **kwargs: P.kwargs) -> R:
        with ray_errors():
            rpc = self._rpc if self._rpc is not None else self.connect()
            if self._configured is not None:
                await asyncio.wait_for(self._configured, timeout)
                self._configured = None
            if not self._same_build:
                check_build(await asyncio.wait_for(rpc.remote(Api.ping), timeout))
                self._same_build = True
            result: R = await asyncio.wait_for(rpc.remote(op, *args, **kwargs), timeout)
            return result
