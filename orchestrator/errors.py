"""The rayprof exception hierarchy.

    RayprofError
    ├── ConfigurationError        server-side settings are unusable
    ├── InvalidRequestError       the caller asked for something we refuse (HTTP 400/422)
    │   ├── IdempotencyKeyReusedError  a submit's key was used for another request (HTTP 422)
    │   └── InvalidWatchError     a watch that could never act as asked (HTTP 422)
    ├── UnauthorizedError         missing or wrong bearer token (HTTP 401)
    ├── ForbiddenError            a request from another site, or a call without its registration secret (HTTP 403)
    ├── NotFoundError             unknown target, profile or watch id (HTTP 404)
    │   ├── TargetNotFoundError
    │   ├── ProfileNotFoundError
    │   └── WatchNotFoundError
    ├── ConflictError             a window already runs on the target (HTTP 409)
    ├── ControllerUnavailableError  the control actor cannot be reached (HTTP 503)
    │   ├── RestoringError        it is still reading its saved state from storage
    │   ├── ClusterNameInUseError  another live cluster holds its cluster name's lease
    │   └── ControllerBuildMismatchError  it runs another rayprof build (it outlived an upgrade)
    ├── StorageError              reading or writing artifacts failed
    │   ├── IntegrityError        an artifact's bytes do not match the manifest
    │   ├── AlreadyExistsError    a write that must not replace an object found one (a manifest)
    │   └── CleanupIncompleteError  ``rayprof gc`` could not delete some of what it found
    ├── IncompatibleRecordError   an answer or stored record this release cannot read (another release wrote it)
    ├── ProfileTimeoutError       waiting for a profile ran out of time
    └── IllegalTransitionError    a bug: the controller tried a state change its diagram forbids

Each exception carries the context a user needs (profile id, target, rank),
its HTTP status and code (the service answers ``{"error": code, "detail":
message}``, and the HTTP client raises the same class from it) and the CLI exit
status it maps to: 2 for what the caller can fix (4xx), 1 for what went wrong
on the way (5xx). Raised in the control actor, it reaches callers as itself
(:func:`actors.controller.rpc.ray_errors`). ``tests/unit/test_errors.py`` checks
every class maps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class RayprofError(Exception):
    """Base class of every error rayprof raises on purpose."""

    code = "rayprof_error"
    http_status = 500
    own_words = False
    """A server-side (5xx) error whose message rayprof composes from its own words. Any other server-side
    message may carry a library's text (addresses, paths): the service and the MCP server log it, unshown."""

    @property
    def exit_status(self) -> int:
        """The CLI's exit status for this error."""
        return EXIT_USAGE if 400 <= self.http_status < 500 else EXIT_FAILED

    @property
    def message_shown(self) -> bool:
        """Whether a caller of the service or of an MCP tool gets this error's message."""
        return self.http_status < 500 or self.own_words

    def __init__(self, message: str, *, profile_id: str | None = None, target: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.profile_id = profile_id
        self.target = target

    def __reduce__(self):
        # Errors cross actor boundaries; keep their context when pickled.
        return (_rebuild, (type(self), self.message, self.profile_id, self.target))


def _rebuild(cls, message, profile_id, target):
    return cls(message, profile_id=profile_id, target=target)


class ConfigurationError(RayprofError):
    code = "configuration_error"
    http_status = 500


class InvalidRequestError(RayprofError):
    code = "invalid_request"
    http_status = 400


class IdempotencyKeyReusedError(InvalidRequestError):
    code = "idempotency_key_reused"
    http_status = 422


class InvalidWatchError(InvalidRequestError):
    """A watch refused at creation: checked against the server's limits, so it never fails on firing."""

    code = "invalid_watch"
    http_status = 422


class UnauthorizedError(RayprofError):
    code = "unauthorized"
    http_status = 401


class ForbiddenError(RayprofError):
    code = "forbidden"
    http_status = 403


class NotFoundError(RayprofError):
    code = "not_found"
    http_status = 404


class TargetNotFoundError(NotFoundError):
    code = "target_not_found"


class ProfileNotFoundError(NotFoundError):
    code = "profile_not_found"


class WatchNotFoundError(NotFoundError):
    code = "watch_not_found"


class ConflictError(RayprofError):
    code = "conflict"
    http_status = 409


class ControllerUnavailableError(RayprofError):
    code = "controller_unavailable"
    http_status = 503
    own_words = True


class RestoringError(ControllerUnavailableError):
    code = "restoring"


class ClusterNameInUseError(ControllerUnavailableError):
    code = "cluster_name_in_use"


class ControllerBuildMismatchError(ControllerUnavailableError):
    """The control actor runs another build of rayprof than its caller: a detached actor keeps the code it
    started with through an upgrade (:mod:`actors.controller.upgrade`)."""

    code = "controller_build_mismatch"


class StorageError(RayprofError):
    code = "storage_error"
    http_status = 502


class IntegrityError(StorageError):
    code = "integrity_error"
    own_words = True


class AlreadyExistsError(StorageError):
    code = "already_exists"
    http_status = 409


class CleanupIncompleteError(StorageError):
    code = "gc_incomplete"


class IncompatibleRecordError(RayprofError):
    # 502: what came back from elsewhere (the service, storage, a downloaded folder) could not be read here.
    code = "incompatible_record"
    http_status = 502
    own_words = True


class ProfileTimeoutError(RayprofError):
    code = "timeout"
    http_status = 504
    own_words = True


class IllegalTransitionError(RayprofError):
    code = "internal_error"
    http_status = 500


def validation_problems(errors: Iterable[Mapping[str, Any]]) -> str:
    """Pydantic's or FastAPI's validation errors (``.errors()``) as one line a user can act on:
    ``field: what is wrong`` for each, joined by ``; `` (the HTTP answer, the CLI and the MCP tool error say it so)."""
    problems = [f"{'.'.join(str(part) for part in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
    return "; ".join(problems) or "invalid request"
