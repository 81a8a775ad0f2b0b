"""The control actor's client RPCs, typed: what the HTTP service and the in-cluster Python client call.

``ControllerRpc(handle).get(profile_id)`` sends one call and returns its ``ObjectRef``; the caller
awaits it (the service) or ``ray.get``s it (the Python client) inside :func:`ray_errors`, the one
place where Ray's errors become rayprof's (httpx's ``map_exceptions`` is the model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ControllerUnavailableError, RayprofError
from orchestrator.settings import DEFAULT_HISTORY_MAX_POINTS

if TYPE_CHECKING:
    from ray import ObjectRef

    from orchestrator.models.agent_protocol import StorageSpec
    from orchestrator.models.control import ControllerConfig, TargetInfo
    from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
    from orchestrator.models.history import TargetHistory
    from orchestrator.models.profile import Manifest, ProfileStatus
    from orchestrator.models.reads import ProfileRead
    from orchestrator.models.requests import ProfileRequest, ProfileState
    from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage

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


class ControllerRpc:
    """One typed method per client RPC of :class:`actors.controller.actor.Controller`; each sends
    the call and returns its ``ObjectRef`` (see the controller's method for what it does)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def ping(self) -> ObjectRef[str]:
        return self.handle.ping.remote()

    def configure(self, storage: StorageSpec) -> ObjectRef[None]:
        return self.handle.configure.remote(storage)

    def config(self) -> ObjectRef[ControllerConfig]:
        return self.handle.config.remote()

    def submit(self, request: ProfileRequest, idempotency_key: str | None) -> ObjectRef[ProfileStatus]:
        return self.handle.submit.remote(request, idempotency_key)

    def get(self, profile_id: str) -> ObjectRef[ProfileStatus]:
        return self.handle.get.remote(profile_id)

    def wait(self, profile_id: str, timeout_s: float) -> ObjectRef[ProfileStatus]:
        return self.handle.wait.remote(profile_id, timeout_s)

    def read(self, profile_id: str, wait_s: float = 0.0) -> ObjectRef[ProfileRead]:
        return self.handle.read.remote(profile_id, wait_s)

    def list(
        self, target: str | None, state: ProfileState | None, limit: int, offset: int
    ) -> ObjectRef[ProfilePage]:
        return self.handle.list.remote(target, state, limit, offset)

    def cancel(self, profile_id: str) -> ObjectRef[ProfileStatus]:
        return self.handle.cancel.remote(profile_id)

    def delete(self, profile_id: str) -> ObjectRef[None]:
        return self.handle.delete.remote(profile_id)

    def remove(self, profile_id: str) -> ObjectRef[ProfileRead]:
        return self.handle.remove.remote(profile_id)

    def gc(self, request: GcRequest) -> ObjectRef[GcReport]:
        return self.handle.gc.remote(request)

    def manifest(self, profile_id: str) -> ObjectRef[Manifest]:
        return self.handle.manifest.remote(profile_id)

    def report_html(self, profile_id: str) -> ObjectRef[bytes]:
        return self.handle.report_html.remote(profile_id)

    def profile_storage(self, profile_id: str) -> ObjectRef[StorageSpec]:
        return self.handle.profile_storage.remote(profile_id)

    def targets(self) -> ObjectRef[list[TargetInfo]]:
        return self.handle.targets.remote()

    def history(
        self,
        target: str,
        run: str | None,
        span_s: float,
        ranks: list[int] | None,
        max_points: int = DEFAULT_HISTORY_MAX_POINTS,
    ) -> ObjectRef[TargetHistory]:
        return self.handle.history.remote(target, run, span_s, ranks, max_points)

    def stacks(self, target: str, native: bool, run: str | None) -> ObjectRef[StacksBundle]:
        return self.handle.stacks.remote(target, native, run)

    def create_watch(self, spec: WatchSpec) -> ObjectRef[WatchStatus]:
        return self.handle.create_watch.remote(spec)

    def get_watch(self, watch_id: str) -> ObjectRef[WatchStatus]:
        return self.handle.get_watch.remote(watch_id)

    def list_watches(self) -> ObjectRef[list[WatchStatus]]:
        return self.handle.list_watches.remote()

    def delete_watch(self, watch_id: str) -> ObjectRef[WatchStatus]:
        return self.handle.delete_watch.remote(watch_id)
