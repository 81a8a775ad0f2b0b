"""rayprof: on-demand torch.profiler windows on live Ray Train jobs.

Public names load on first use: the export child process imports
``orchestrator.layout`` and training workers import ``orchestrator.models.agent_protocol``;
neither pays for the client, the service or the analysis.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ProfileHandle": "orchestrator.client",
    "ProfilingClient": "orchestrator.client",
    "AlreadyExistsError": "orchestrator.errors",
    "CleanupIncompleteError": "orchestrator.errors",
    "ClusterNameInUseError": "orchestrator.errors",
    "ConfigurationError": "orchestrator.errors",
    "ConflictError": "orchestrator.errors",
    "ControllerBuildMismatchError": "orchestrator.errors",
    "ControllerUnavailableError": "orchestrator.errors",
    "ForbiddenError": "orchestrator.errors",
    "IdempotencyKeyReusedError": "orchestrator.errors",
    "IllegalTransitionError": "orchestrator.errors",
    "IncompatibleRecordError": "orchestrator.errors",
    "IntegrityError": "orchestrator.errors",
    "InvalidRequestError": "orchestrator.errors",
    "InvalidWatchError": "orchestrator.errors",
    "NotFoundError": "orchestrator.errors",
    "ProfileNotFoundError": "orchestrator.errors",
    "ProfileTimeoutError": "orchestrator.errors",
    "RayprofError": "orchestrator.errors",
    "RestoringError": "orchestrator.errors",
    "StorageError": "orchestrator.errors",
    "TargetNotFoundError": "orchestrator.errors",
    "UnauthorizedError": "orchestrator.errors",
    "WatchNotFoundError": "orchestrator.errors",
    "Manifest": "orchestrator.models.profile",
    "ProfileRequest": "orchestrator.models.requests",
    "ProfileState": "orchestrator.models.requests",
    "ProfileStatus": "orchestrator.models.profile",
    "RankState": "orchestrator.models.requests",
    "StacksBundle": "orchestrator.models.diagnosis",
    "TargetInfo": "orchestrator.models.control",
    "WatchSpec": "orchestrator.models.diagnosis",
    "WatchStatus": "orchestrator.models.diagnosis",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return __all__
