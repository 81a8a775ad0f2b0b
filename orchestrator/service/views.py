"""What the HTTP API takes and answers, beyond the models the controller uses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.models.common import Name
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import WatchStatus
from orchestrator.models.profile import Manifest, ProfileStatus

__all__ = ["ErrorBody", "ProfileView", "StacksRequest", "StorageView", "TargetList", "WatchList"]


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileView(ProfileStatus):
    """A profile as the HTTP API shows it: its status, where to poll, and the manifest once it ended."""

    status_url: str = Field(description="GET this URL for the current state.")
    manifest: Manifest | None = Field(default=None, description="Inlined once the profile has ended.")


class StacksRequest(_Response):
    """``POST /v1/targets/{target}/stacks``: take every live rank's stacks now."""

    native: bool = Field(default=False, description="Add native frames through py-spy (rayprof[native]).")
    run: Name | None = Field(
        default=None, description="The run's Ray job (submission id or job id) when two live runs share the target name."
    )


class TargetList(_Response):
    """``GET /v1/targets``: live training runs with agents."""

    targets: list[TargetInfo]
    note: str | None = Field(None, description="Where there is no target: how a run becomes one.")


class StorageView(_Response):
    """``GET /v1/storage``: the root new profiles are stored under; ``GET /v1/profiles/{id}/storage``: the root
    one profile was stored under, which clients download it from (``{uri}/{target}/{id}/``)."""

    uri: str


class WatchList(_Response):
    """``GET /v1/watches``: every watch."""

    watches: list[WatchStatus]


class ErrorBody(_Response):
    """Every error response; server errors (5xx) add an ``error_id`` to find the logged details by."""

    error: str
    detail: str
    error_id: str | None = None
