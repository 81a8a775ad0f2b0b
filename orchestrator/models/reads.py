"""What the controller answers to a client's read of one profile: everything one HTTP request
needs, in one controller call."""

from __future__ import annotations

from orchestrator.models.common import StrictModel
from orchestrator.models.profile import Manifest, ProfileStatus

__all__ = ["ProfileRead"]


class ProfileRead(StrictModel):
    """A profile's status with its manifest once it has ended with one.

    ``deleted``: the read was a DELETE of a finished profile; ``status`` is the record as it was.
    """

    status: ProfileStatus
    manifest: Manifest | None = None
    deleted: bool = False
