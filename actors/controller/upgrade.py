"""A control actor of another build: refused with what to do, or replaced when asked.

The control actor is detached: it keeps the code of the rayprof that started it for as long as the cluster lives,
through every upgrade of the package beside it, and a service or client of a newer build would otherwise talk to
it as if nothing had changed. Whoever connects compares the build id it answers to ``ping``
(:func:`orchestrator.build.build_id`) with its own. A different one is refused
(:func:`orchestrator.build.check_build`), or replaced where the caller asked
(``rayprof serve --replace-controller``, ``ProfilingClient.in_cluster(replace_controller=True)``): the old actor
is killed for good and a new one of this build restores everything from its home storage, as after a restart.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from actors.controller.actor import create_controller
from actors.controller.handle import find_controller
from actors.controller.rpc import ControllerRpc, ray_errors
from orchestrator.build import check_build
from orchestrator.errors import ControllerUnavailableError
from orchestrator.models.api import ProfilingApi as Api
from orchestrator.models.control import ControllerConfig

__all__ = ["REPLACE_TIMEOUT_S", "connect", "retire_other_build"]

# How long the old actor may take to die and free its name, and a new one to answer (Ray's own scheduling).
REPLACE_TIMEOUT_S = 60.0
_POLL_S = 0.1


def _build_of(handle: Any, timeout_s: float) -> str:
    with ray_errors():
        found: str = ray.get(ControllerRpc(handle).remote(Api.ping), timeout=timeout_s)
    return found


def retire_other_build(*, replace: bool, timeout_s: float = REPLACE_TIMEOUT_S) -> bool:
    """Check the running control actor's build, if one runs: of another build (or, when ``replace``, one that
    cannot answer), kill it and wait until its name is free (``replace``: True is returned) or raise
    :class:`~orchestrator.errors.ControllerBuildMismatchError`. False: none runs, or it runs this build."""
    handle = find_controller()
    if handle is None:
        return False
    try:
        check_build(_build_of(handle, timeout_s))
        return False
    except ControllerUnavailableError:  # another build (a ControllerBuildMismatchError), or no answer at all
        if not replace:
            raise
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / _POLL_S) + 1):
        if find_controller() is None:
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    raise ControllerUnavailableError(f"the old rayprof control actor did not stop within {timeout_s:.0f} s")


def connect(config: ControllerConfig, *, replace: bool = False) -> Any:
    """The handle of a control actor of this build: the running one, a new one where none runs, or (``replace``)
    a new one in place of one of another build (:func:`retire_other_build`)."""
    retire_other_build(replace=replace)
    return create_controller(config)
