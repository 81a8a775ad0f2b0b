"""The client's backend that calls the control actor through Ray (inside the cluster)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ControllerUnavailableError, RayprofError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage

if TYPE_CHECKING:
    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["ActorBackend"]

_READ_RETRIES = 10


class ActorBackend:
    """Calls the control actor through Ray."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def _call(self, method: str, *args: Any, timeout: float = 60.0, retries: int = 0) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        for attempt in range(retries + 1):
            try:
                return ray.get(getattr(self._handle, method).remote(*args), timeout=timeout)
            except RayTaskError as e:
                if isinstance(e.cause, RayprofError):
                    raise e.cause from None
                raise
            except (RayActorError, ray.exceptions.GetTimeoutError) as e:
                if attempt == retries:
                    raise ControllerUnavailableError(f"the rayprof control actor is unavailable: {e}") from e
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def _read(self, method: str, *args: Any) -> Any:
        # Reads are idempotent: ride out a controller restart (it restores its state).
        return self._call(method, *args, retries=_READ_RETRIES)

    def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus:
        # With a key a submit is safe to repeat: a retry after a restart or a timeout gets the first profile.
        retries = _READ_RETRIES if idempotency_key is not None else 0
        return self._call("submit", request, idempotency_key, retries=retries)

    def get(self, profile_id: str) -> ProfileStatus:
        return self._read("get", profile_id)

    def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus:
        return self._call("wait", profile_id, timeout_s, timeout=timeout_s + 30)

    def list(self, target: str | None, state: ProfileState | None, limit: int, offset: int) -> ProfilePage:
        return self._read("list", target, state, limit, offset)

    def delete(self, profile_id: str) -> None:
        self._call("delete", profile_id)

    def gc(self, request: GcRequest) -> GcReport:
        return self._call("gc", request, timeout=600.0)

    def cancel(self, profile_id: str) -> ProfileStatus:
        return self._call("cancel", profile_id)

    def manifest(self, profile_id: str) -> Manifest:
        return self._read("manifest", profile_id)

    def targets(self) -> list[TargetInfo]:
        return self._read("targets")

    def history(self, target: str, run: str | None, span_s: float, ranks: list[int] | None) -> TargetHistory:
        return self._read("history", target, run, span_s, ranks)

    def storage(self) -> StorageSpec:
        # Asked each time: the storage can be reconfigured while this client lives.
        return self._read("config").storage

    def diff(self, a: str, b: str) -> ProfileDiff:
        from orchestrator.analysis.diff import diff_profiles
        from orchestrator.analysis.diff_inputs import load_stored

        root = self.storage()
        return diff_profiles(load_stored(self.manifest(a), root), load_stored(self.manifest(b), root))

    def stacks(self, target: str, native: bool, run: str | None) -> StacksBundle:
        return self._call("stacks", target, native, run, timeout=120.0)

    def create_watch(self, spec: WatchSpec) -> WatchStatus:
        return self._call("create_watch", spec)

    def get_watch(self, watch_id: str) -> WatchStatus:
        return self._read("get_watch", watch_id)

    def list_watches(self) -> list[WatchStatus]:
        return self._read("list_watches")

    def delete_watch(self, watch_id: str) -> None:
        self._call("delete_watch", watch_id)
