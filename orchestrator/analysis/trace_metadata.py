"""What the agent writes into a trace's top-level metadata (its stack samples, its clock of the training thread), read
back as the model it was written from: a key another tool's trace lacks reads as nothing, a malformed one as nothing
with the reason, for the rank's issues."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["read_metadata"]

M = TypeVar("M", bound=BaseModel)


def read_metadata(header: Mapping[str, Any], key: str, model: type[M], what: str) -> tuple[M | None, str | None]:
    """``header[key]`` as ``model`` (None where the trace has no such key), and why it was not read where it is
    malformed (``what`` names it: 'stack samples')."""
    raw = header.get(key)
    if raw is None:
        return None, None
    try:
        return model.model_validate(raw), None
    except ValidationError as e:
        return None, f"the trace's {what} ({key}): malformed, not read: {e.errors()[0]['msg']}"
