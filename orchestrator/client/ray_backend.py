"""The client's Ray transport: any :class:`~orchestrator.models.api.ProfilingApi` operation, sent to the
control actor through Ray (inside the cluster).

How long a call may take and whether it is retried come from the operation's policy
(:func:`orchestrator.models.api.policy`): reads ride out a controller restart, writes are sent once.
A controller killed for good and started anew (``rayprof serve --replace-controller``) is followed by its
name, once it has answered with this build.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.controller.handle import find_controller
from actors.controller.rpc import ControllerRpc, is_unreachable, ray_errors
from orchestrator.build import check_build
from orchestrator.errors import ControllerUnavailableError
from orchestrator.models.api import ProfilingApi, bind, call_timeout, repeatable

if TYPE_CHECKING:
    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["ActorBackend"]

_READ_RETRIES = 10
CALL_TIMEOUT_S = 60.0
"""How long one plain call may take before the controller counts as unreachable."""
POLL_MARGIN_S = 30.0
"""A long poll (``wait``) may take its own wait plus this."""


class ActorBackend:
    """Calls the control actor through Ray."""

    def __init__(self, handle: Any) -> None:
        self._controller = ControllerRpc(handle)
        # Whether the controller answered ping with this build: asked before the first call through a handle.
        self._same_build = False

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``name(*args, **kwargs)`` on the control actor, as its policy says: timed, retried when safe."""
        import ray

        arguments = bind(name, args, kwargs)
        timeout = call_timeout(name, arguments, CALL_TIMEOUT_S, POLL_MARGIN_S)
        # A repeatable call rides out a controller restart (it restores its state); others are sent once.
        retries = _READ_RETRIES if repeatable(name, arguments) else 0
        op = getattr(ProfilingApi, name)
        for attempt in range(retries + 1):
            try:
                with ray_errors():
                    if not self._same_build:
                        check_build(ray.get(self._controller.remote(ProfilingApi.ping), timeout=timeout))
                        self._same_build = True
                    return ray.get(self._controller.remote(op, **arguments), timeout=timeout)
            except ControllerUnavailableError as e:
                if not is_unreachable(e):
                    raise
                self._follow_name()
                if attempt == retries:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def _follow_name(self) -> None:
        """After an unreachable call: the actor that holds the controller's name now, where it is another one
        (the old was killed for good and replaced), its build checked before the next call. A restarting
        controller keeps its actor, and its handle."""
        handle = find_controller()
        if handle is not None and handle._actor_id != self._controller.handle._actor_id:
            self._controller = ControllerRpc(handle)
            self._same_build = False

    def diff(self, a: str, b: str) -> ProfileDiff:
        """Compared here, in the caller's process: each side read from the storage its record names."""
        from orchestrator.analysis.diff import diff_profiles
        from orchestrator.analysis.diff_inputs import load_stored

        sides = [load_stored(self.call("manifest", p), self.call("profile_storage", p)) for p in (a, b)]
        return diff_profiles(*sides)
