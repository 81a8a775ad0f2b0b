"""The Ray transport of :class:`~orchestrator.models.api.ProfilingApi`: what the HTTP service and the
in-cluster Python client call the control actor through.

``ControllerRpc(handle).remote(ProfilingApi.get, profile_id)`` sends one call and returns its
``ObjectRef``, typed by the protocol's method; the caller awaits it (the service) or ``ray.get``s it
(the Python client) inside :func:`ray_errors`, the one place where Ray's errors become rayprof's
(httpx's ``map_exceptions`` is the model). No operation is written here: any of the protocol's goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from orchestrator.errors import ControllerUnavailableError, RayprofError
from orchestrator.models.api import Operation, bind

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["ControllerRpc", "is_unreachable", "ray_errors"]


@contextmanager
def ray_errors() -> Iterator[None]:
    """Ray's errors as rayprof's, around a call to the control actor.

    A :class:`~orchestrator.errors.RayprofError` the controller raised comes out as itself; a
    controller that cannot be reached (dead, restarting, or slower than the caller's timeout)
    is a :class:`~orchestrator.errors.ControllerUnavailableError` caused by the Ray error
    (:func:`is_unreachable`). Any other error is a bug and passes through.
    """
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        yield
    except RayTaskError as e:
        if isinstance(e.cause, RayprofError):
            raise e.cause from None
        raise
    # asyncio.wait_for raises asyncio.TimeoutError, not TimeoutError, on 3.10.
    except (asyncio.TimeoutError, TimeoutError, RayActorError, GetTimeoutError) as e:
        raise ControllerUnavailableError(f"the rayprof control actor is unavailable: {type(e).__name__}") from e


def is_unreachable(error: ControllerUnavailableError) -> bool:
    """Whether ``error`` says the controller could not be reached (worth a retry or a new handle),
    not that it answered "unavailable" itself (still restoring, cluster name held elsewhere)."""
    return error.__cause__ is not None


P = ParamSpec("P")
R = TypeVar("R")


class ControllerRpc:
    """Calls any operation of :class:`~orchestrator.models.api.ProfilingApi` on the control actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def remote(self, op: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]:
        """Send ``op(*args, **kwargs)``, checked against the protocol first; its arguments go by keyword (a
        process that imported this module before the actor was upgraded checks by the ``(**kwargs)`` Ray gives
        every method of a changed class: ``actors.upstream._send`` says how)."""
        arguments = bind(op.__name__, args, kwargs)
        ref: ObjectRef[R] = getattr(self.handle, op.__name__).remote(**arguments)
        return ref
