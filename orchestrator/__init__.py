"""rayprof: on-demand torch.profiler windows on live Ray Train jobs."""

from orchestrator.client import ProfileHandle, ProfilingClient
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
