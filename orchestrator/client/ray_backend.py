"""The client's Ray transport: any :class:`~orchestrator.models.api.ProfilingApi` operation, sent to the
control actor through Ray (inside the cluster).

How long a call may take and whether it is retried come from the operation's policy
(:func:`orchestrator.models.api.policy`): reads ride out a controller restart, writes are sent once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.controller.rpc import ControllerRpc, is_unreachable, ray_errors
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
                    return ray.get(self._controller.remote(op, **arguments), timeout=timeout)
            except ControllerUnavailableError as e:
                if not is_unreachable(e) or attempt == retries:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def diff(self, a: str, b: str) -> ProfileDiff:
        """Compared here, in the caller's process: each side read from the storage its record names."""
        from orchestrator.analysis.diff import diff_profiles
        from orchestrator.analysis.diff_inputs import load_stored

        sides = [load_stored(self.call("manifest", p), self.call("profile_storage", p)) for p in (a, b)]
        return diff_profiles(*sides)
