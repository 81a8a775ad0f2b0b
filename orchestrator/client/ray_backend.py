"""The client's backend that calls the control actor through Ray (inside the cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from actors.controller.rpc import ControllerRpc, is_unreachable, ray_errors
from orchestrator.errors import ControllerUnavailableError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage

if TYPE_CHECKING:
    from ray import ObjectRef

    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["ActorBackend"]

_READ_RETRIES = 10
T = TypeVar("T")


class ActorBackend:
    """Calls the control actor through Ray."""

    def __init__(self, handle: Any) -> None:
        self._controller = ControllerRpc(handle)

    def _call(self, call: Callable[[ControllerRpc], ObjectRef[T]], *, timeout: float = 60.0, retries: int = 0) -> T:
        import ray

        for attempt in range(retries + 1):
            try:
                with ray_errors():
                    return ray.get(call(self._controller), timeout=timeout)
            except ControllerUnavailableError as e:
                if not is_unreachable(e) or attempt == retries:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def _read(self, call: Callable[[ControllerRpc], ObjectRef[T]]) -> T:
        # Reads are idempotent: ride out a controller restart (it restores its state).
        return self._call(call, retries=_READ_RETRIES)

    def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus:
        # With a key a submit is safe to repeat: a retry after a restart or a timeout gets the first profile.
        retries = _READ_RETRIES if idempotency_key is not None else 0
        return self._call(lambda c: c.submit(request, idempotency_key), retries=retries)

    def get(self, profile_id: str) -> ProfileStatus:
        return self._read(lambda c: c.get(profile_id))

    def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        return self._call(lambda c: c.wait(profile_id, timeout_s), timeout=timeout_s + 30)

    def list(self, target: str | None, state: ProfileState | None, limit: int, offset: int) -> ProfilePage:
        return self._read(lambda c: c.list(target, state, limit, offset))

    def delete(self, profile_id: str) -> None:
        self._call(lambda c: c.delete(profile_id))

    def gc(self, request: GcRequest) -> GcReport:
        return self._call(lambda c: c.gc(request), timeout=600.0)

    def cancel(self, profile_id: str) -> ProfileStatus:
        return self._call(lambda c: c.cancel(profile_id))

    def manifest(self, profile_id: str) -> Manifest:
        return self._read(lambda c: c.manifest(profile_id))

    def targets(self) -> list[TargetInfo]:
        return self._read(lambda c: c.targets())

    def history(
        self, target: str, run: str | None, span_s: float, ranks: list[int] | None, max_points: int
    ) -> TargetHistory:
        return self._read(lambda c: c.history(target, run, span_s, ranks, max_points))

    def storage(self) -> StorageSpec:
        # Asked each time: the storage can be reconfigured while this client lives.
        return self._read(lambda c: c.config()).storage

    def diff(self, a: str, b: str) -> ProfileDiff:
        from orchestrator.analysis.diff import diff_profiles
        from orchestrator.analysis.diff_inputs import load_stored

        # Each from the storage its record names: the configured one may have changed since.
        sides = [load_stored(self.manifest(p), self._read(lambda c, p=p: c.profile_storage(p))) for p in (a, b)]
        return diff_profiles(*sides)

    def stacks(self, target: str, native: bool, run: str | None) -> StacksBundle:
        return self._call(lambda c: c.stacks(target, native, run), timeout=120.0)

    def create_watch(self, spec: WatchSpec) -> WatchStatus:
        return self._call(lambda c: c.create_watch(spec))

    def get_watch(self, watch_id: str) -> WatchStatus:
        return self._read(lambda c: c.get_watch(watch_id))

    def list_watches(self) -> list[WatchStatus]:
        return self._read(lambda c: c.list_watches())

    def delete_watch(self, watch_id: str) -> None:
        self._call(lambda c: c.delete_watch(watch_id))
