"""``ProfilingClient``: one interface whether you talk to the control actor
directly (inside the Ray cluster) or to the HTTP service."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import (
    ControllerUnavailableError,
    IntegrityError,
    InvalidRequestError,
    ProfileTimeoutError,
    RayprofError,
    StorageError,
)
from orchestrator.layout import MANIFEST_NAME, profile_prefix
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.api import Operation
from orchestrator.models.api import ProfilingApi as Api
from orchestrator.models.common import IdempotencyKey, Name
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage
from orchestrator.settings import DEFAULT_HISTORY_MAX_POINTS, DEFAULT_HISTORY_SPAN_S, DEFAULT_PAGE_SIZE
from orchestrator.storage import open_storage
from orchestrator.storage.base import sha256_file

if TYPE_CHECKING:
    from orchestrator.analysis.diff import ProfileDiff

__all__ = ["ProfileHandle", "ProfilingClient"]

ProgressFn = Callable[[ProfileStatus], None]
P = ParamSpec("P")
R = TypeVar("R")


class Transport(Protocol):
    """How a client reaches rayprof: the control actor through Ray
    (:class:`~orchestrator.client.ray_backend.ActorBackend`) or the HTTP service
    (:class:`~orchestrator.client.http.HttpBackend`). Either sends any operation of
    :class:`~orchestrator.models.api.ProfilingApi` by name; a diff runs where the profiles' storage is."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...
    def diff(self, a: str, b: str) -> ProfileDiff: ...


def _call(transport: Transport, op: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``op`` over ``transport``, typed by the protocol's method (``_call(t, Api.get, profile_id)``)."""
    result: R = transport.call(op.__name__, *args, **kwargs)
    return result


class ProfileHandle:
    """A submitted profile: poll it, wait for it, cancel it, download it."""

    def __init__(self, backend: Transport, status: ProfileStatus) -> None:
        self._backend = backend
        self.id = status.id
        self.target = status.target
        self.last_status = status

    def __repr__(self) -> str:
        return f"ProfileHandle(id={self.id!r}, target={self.target!r}, state={self.last_status.state.value})"

    def status(self) -> ProfileStatus:
        """State now, with per-rank progress."""
        self.last_status = _call(self._backend, Api.get, self.id)
        return self.last_status

    def wait(self, timeout: float = 300.0, progress: ProgressFn | None = None) -> Manifest:
        """Block until the profile ends; returns its manifest (DONE, PARTIAL, FAILED or CANCELLED).

        ``progress`` is called with each new status. Raises
        :class:`ProfileTimeoutError` if it has not ended within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        status = self.last_status
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProfileTimeoutError(
                    f"profile {self.id} still {status.state.value} after {timeout:g}s", profile_id=self.id
                )
            try:
                status = _call(self._backend, Api.wait, self.id, min(left, 10.0))
            except ControllerUnavailableError:
                # The controller restarts and restores its state; keep waiting.
                time.sleep(min(1.0, max(left, 0.0)))
                continue
            self.last_status = status
            if progress is not None:
                progress(status)
            if status.state.is_terminal:
                if status.manifest_uri is None:
                    raise RayprofError(
                        f"profile {self.id} ended {status.state.value} without a manifest: {status.reason}",
                        profile_id=self.id,
                    )
                return _call(self._backend, Api.manifest, self.id)

    def cancel(self) -> ProfileStatus:
        """Ask every rank to drop the window."""
        self.last_status = _call(self._backend, Api.cancel, self.id)
        return self.last_status

    def manifest(self) -> Manifest:
        """The stored manifest (only once the profile has ended); it must be this profile's."""
        manifest = _call(self._backend, Api.manifest, self.id)
        if (manifest.profile_id, manifest.target) != (self.id, self.target):
            raise IntegrityError(
                f"asked for the manifest of {self.target}/{self.id} and got the one of "
                f"{manifest.target}/{manifest.profile_id}",
                profile_id=self.id,
            )
        return manifest

    def download(self, dest: str | Path) -> Path:
        """Fetch the manifest and every artifact it lists into ``dest``, verifying sha256."""
        return download_profile(self.manifest(), _call(self._backend, Api.profile_storage, self.id), Path(dest))


def download_profile(manifest: Manifest, spec: StorageSpec, dest: Path) -> Path:
    """Copy a profile's files into ``dest``; raises :class:`IntegrityError` on a checksum mismatch. A file already
    in ``dest`` with the manifest's checksum is kept as it is.

    Files are read from ``spec`` (the storage root the profile's record names: after a
    reconfigure, earlier profiles stay where they were written) under ``{target}/{profile_id}``,
    never from a location the manifest names, and every file is written inside ``dest`` or not at all.
    """
    storage = open_storage(spec)
    stored = storage.scoped(profile_prefix(manifest.target, manifest.profile_id))
    folder = Path(dest).resolve()
    # Every destination is checked before the first byte is written.
    files = [(artifact, _inside(folder, artifact.key)) for artifact in manifest.all_artifacts()]
    folder.mkdir(parents=True, exist_ok=True)
    for artifact, path in files:
        if path.is_file() and sha256_file(path) == artifact.sha256:
            continue  # fetched before (a report cache's copy): the same bytes, not fetched again
        try:
            stored.download(artifact.key, path, expected_sha256=artifact.sha256)
        except StorageError as e:
            if manifest.storage_uri == stored.root_uri or isinstance(e, IntegrityError):
                raise
            # Not read from there on purpose; say why the file is not where we looked.
            raise StorageError(
                f"{e.message}; the manifest says the profile was stored under {manifest.storage_uri}, outside the "
                f"storage its record names, {storage.root_uri}",
                profile_id=manifest.profile_id,
            ) from e
    # The stored bytes, not this client's reading of them: a newer release's fields stay in the copy.
    stored.download(MANIFEST_NAME, _inside(folder, MANIFEST_NAME))
    return folder


def _inside(folder: Path, key: str) -> Path:
    """``folder / key``, resolved (symlinks included); refused when it lands outside ``folder``."""
    path = (folder / key).resolve()
    if not path.is_relative_to(folder) or path == folder:
        raise IntegrityError(f"artifact {key!r} would be written outside {folder}")
    return path


def _idempotency_key(value: str) -> str:
    try:
        return TypeAdapter(IdempotencyKey).validate_python(value)
    except ValidationError:
        raise InvalidRequestError(
            f"invalid idempotency key {value!r}: 1 to 255 printable ASCII characters, no spaces"
        ) from None


def _profile_id(value: str) -> str:
    try:
        return TypeAdapter(Name).validate_python(value)
    except ValidationError:
        raise InvalidRequestError(
            f"invalid profile id {value!r}: letters, digits, '.', '_', '-' and '=' only, no '..'"
        ) from None


class ProfilingClient:
    """Profile live Ray Train runs.

    ``ProfilingClient.in_cluster()`` talks to the control actor (creating it if
    absent); ``ProfilingClient(url, token)`` talks to the HTTP service. Both
    offer the same methods.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, backend: Transport | None = None) -> None:
        if backend is None:
            if url is None:
                raise ValueError("pass the service URL, e.g. ProfilingClient('http://127.0.0.1:8000')")
            from orchestrator.client.http import HttpBackend

            backend = HttpBackend(url, token)
        self._backend = backend

    @classmethod
    def in_cluster(
        cls,
        *,
        storage: str | None = None,
        s3_endpoint_url: str | None = None,
        s3_region: str | None = None,
        address: str | None = None,
        replace_controller: bool = False,
    ) -> ProfilingClient:
        """Connect to the control actor of the current Ray cluster, creating it if absent.

        ``storage`` (a path or ``s3://bucket/prefix``) sets where profiles are
        stored; default: ``RAYPROF_STORAGE`` or a local folder. A control actor
        of another rayprof build (the detached actor outlives an upgrade) raises
        :class:`~orchestrator.errors.ControllerBuildMismatchError`, or is replaced
        by one of this build with ``replace_controller`` (it restores its state
        from storage, as after a restart).
        """
        import ray

        from actors.controller.rpc import ControllerRpc
        from actors.controller.upgrade import connect
        from orchestrator.client.ray_backend import ActorBackend
        from orchestrator.config import controller_config, default_storage_spec

        if not ray.is_initialized():
            ray.init(address=address or "auto", log_to_driver=False)
        spec = None
        if storage is not None:
            default = default_storage_spec()
            spec = StorageSpec(
                uri=storage,
                s3_endpoint_url=s3_endpoint_url or default.s3_endpoint_url,
                s3_region=s3_region or default.s3_region,
            )
        handle = connect(controller_config(spec), replace=replace_controller)
        if spec is not None:
            ray.get(ControllerRpc(handle).remote(Api.configure, spec))
        return cls(backend=ActorBackend(handle))

    def targets(self) -> list[TargetInfo]:
        """Live training runs with agents, their ranks and current steps."""
        return _call(self._backend, Api.targets)

    def profile(
        self, target: str, steps: int, *, idempotency_key: str | None = None, **options: Any
    ) -> ProfileHandle:
        """Profile ``steps`` optimizer steps of ``target`` on every rank (or ``ranks=[...]``).

        Options map to ``torch.profiler.profile``: ``record_shapes``,
        ``profile_memory``, ``with_stack``, ``with_flops``, ``with_modules``,
        ``activities``, ``warmup``; plus ``ranks``, ``timeout_s``, ``queue``.
        ``idempotency_key``: retry-safe submit; calling again with the same key and
        the same request (after a timeout, say) returns the first profile instead
        of starting another window (keys are kept 24 h).
        """
        request = ProfileRequest(target=target, steps=steps, **options)
        if idempotency_key is not None:
            idempotency_key = _idempotency_key(idempotency_key)
        return ProfileHandle(self._backend, _call(self._backend, Api.submit, request, idempotency_key))

    def get(self, profile_id: str) -> ProfileHandle:
        """Handle to an existing profile."""
        return ProfileHandle(self._backend, _call(self._backend, Api.get, _profile_id(profile_id)))

    def list(
        self,
        target: str | None = None,
        state: ProfileState | str | None = None,
        *,
        limit: int = DEFAULT_PAGE_SIZE,
        offset: int = 0,
    ) -> ProfilePage:
        """One page of profiles, newest first (``.profiles``, ``.total``)."""
        return _call(self._backend, Api.list, target, ProfileState(state) if state is not None else None, limit, offset)

    def delete(self, profile_id: str) -> None:
        """Delete a finished profile: every file of it in storage, and its record."""
        _call(self._backend, Api.delete, profile_id)

    def gc(self, *, dry_run: bool = False, grace_hours: float | None = None) -> GcReport:
        """Apply retention now and delete leftover folders older than ``grace_hours``; ``dry_run`` deletes nothing."""
        return _call(self._backend, Api.gc, GcRequest(dry_run=dry_run, grace_hours=grace_hours))

    def diff(self, a: str, b: str) -> ProfileDiff:
        """Compare profile ``b`` (after a change) with profile ``a`` (before): step time, phases, ops, findings."""
        return self._backend.diff(a, b)

    def history(
        self,
        target: str,
        *,
        run: str | None = None,
        span_s: float = DEFAULT_HISTORY_SPAN_S,
        ranks: list[int] | None = None,
        max_points: int = DEFAULT_HISTORY_MAX_POINTS,
    ) -> TargetHistory:
        """Step-time history of ``target``'s newest live run (or ``run``) per rank over the last ``span_s``
        seconds: 1 s points up to 10 minutes, 10 s up to 2 hours, 1 minute up to 24 hours. Past
        ``max_points`` (every rank together) the controller downsamples: per-bucket min/median/max of
        the slowest ranks, and a band of every rank."""
        return _call(self._backend, Api.history, target, run, span_s, ranks, max_points)

    def stacks(self, target: str, *, native: bool = False, run: str | None = None) -> StacksBundle:
        """Every live rank's stacks now, grouped (ranks unlike the majority first), stored like a profile.

        ``native`` adds native frames through py-spy where it is installed and may attach; ``run``
        picks the run (its Ray job) when two live runs share the target name (default the newest).
        """
        return _call(self._backend, Api.stacks, target, native, run)

    def watch(self, target: str, **options: Any) -> WatchStatus:
        """Watch ``target`` and act when a condition holds; options are :class:`WatchSpec` fields.

        E.g. ``watch("run", slower_than=1.3, for_s=30, profile_steps=5)``,
        ``watch("run", rank_lag=3)``, ``watch("run", stalled=True, action="stacks")``,
        ``watch("run", every_s=1800, profile_steps=3)`` (a profile now and every 30 minutes).
        """
        return _call(self._backend, Api.create_watch, WatchSpec(target=target, **options))

    def watches(self) -> list[WatchStatus]:
        """Every watch, with its state and firings."""
        return _call(self._backend, Api.list_watches)

    def get_watch(self, watch_id: str) -> WatchStatus:
        """One watch now."""
        return _call(self._backend, Api.get_watch, watch_id)

    def delete_watch(self, watch_id: str) -> None:
        """Stop and forget a watch."""
        _call(self._backend, Api.delete_watch, watch_id)
