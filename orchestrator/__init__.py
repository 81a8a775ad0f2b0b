"""rayprof: on-demand torch.profiler windows on live Ray Train jobs.

The client classes load on first use: training workers import
``orchestrator.models`` and ``orchestrator.storage`` and must not pay for the
client, the service or the analysis.
"""

from typing import Any

from orchestrator.errors import (
    ConfigurationError,
    ConflictError,
    ControllerUnavailableError,
    IntegrityError,
    InvalidRequestError,
    NotFoundError,
    ProfileNotFoundError,
    ProfileTimeoutError,
    RayprofError,
    StorageError,
    TargetNotFoundError,
    UnauthorizedError,
)
from orchestrator.models import Manifest, ProfileRequest, ProfileState, ProfileStatus, RankState, TargetInfo

__all__ = [
    "ConfigurationError",
    "ConflictError",
    "ControllerUnavailableError",
    "IntegrityError",
    "InvalidRequestError",
    "Manifest",
    "NotFoundError",
    "ProfileHandle",
    "ProfileNotFoundError",
    "ProfileRequest",
    "ProfileState",
    "ProfileStatus",
    "ProfileTimeoutError",
    "ProfilingClient",
    "RankState",
    "RayprofError",
    "StorageError",
    "TargetInfo",
    "TargetNotFoundError",
    "UnauthorizedError",
]


def __getattr__(name: str) -> Any:
    if name in ("ProfileHandle", "ProfilingClient"):
        from orchestrator import client

        return getattr(client, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
