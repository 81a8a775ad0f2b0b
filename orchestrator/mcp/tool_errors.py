"""rayprof's errors (:mod:`orchestrator.errors`) as MCP tool errors an agent can act on.

The one mapping for the MCP server, as :func:`orchestrator.cli.main.main` is the one
for exit statuses: each error keeps its code and message, and gains what to do next.
A server fault whose message may carry a library's text (addresses, paths) is
replaced by a generic one, as the HTTP service does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from orchestrator.errors import (
    ConflictError,
    ControllerUnavailableError,
    IncompatibleRecordError,
    InvalidRequestError,
    NotFoundError,
    ProfileTimeoutError,
    RayprofError,
    RestoringError,
    TargetNotFoundError,
    UnauthorizedError,
    validation_problems,
)

__all__ = ["tool_error", "tool_errors"]

logger = logging.getLogger(__name__)

_HINTS: list[tuple[type[RayprofError], str]] = [
    (ConflictError, "a profiling window is already running on this target: call profile again with "
     "request.queue=true to run after it, or wait for the running one (list_targets shows it as active_profile)"),
    (TargetNotFoundError, "call list_targets for the live runs' names"),
    (NotFoundError, "call list_profiles (or list_watches) for the ids that exist"),
    (UnauthorizedError, "the rayprof service wants a bearer token: set RAYPROF_TOKEN_FILE (or RAYPROF_TOKEN) "
     "where `rayprof mcp` runs, or pass --token-file"),
    (RestoringError, "the control actor is reading its saved state: retry in a few seconds"),
    (ControllerUnavailableError, "is the rayprof service up (`rayprof serve`) and the URL right? retry when it is"),
    (ProfileTimeoutError, "the window is still running: call get_profile with wait=true later"),
    (IncompatibleRecordError, "the rayprof service runs another release than `rayprof mcp`: install the service's "
     "release where `rayprof mcp` runs"),
    (InvalidRequestError, "fix the argument named above and call again"),
]


def _hint(error: RayprofError) -> str:
    return next((hint for cls, hint in _HINTS if isinstance(error, cls)), "")


def tool_error(error: Exception) -> ToolError:
    """The tool error ``error`` stands for: ``[code] message. next: hint``."""
    if isinstance(error, ValidationError):
        return ToolError(f"[invalid_request] {validation_problems(error.errors())}. next: fix those arguments and call again")
    if not isinstance(error, RayprofError):
        raise TypeError(f"not a rayprof error: {type(error).__name__}")
    message = error.message
    if not error.message_shown:
        logger.error("rayprof error in an MCP tool: %s", error.code, exc_info=error)
        message = f"the rayprof server side failed ({error.code}); details are in the log of `rayprof mcp`"
    hint = _hint(error)
    return ToolError(f"[{error.code}] {message}" + (f". next: {hint}" if hint else ""))


@contextmanager
def tool_errors() -> Iterator[None]:
    """Raise rayprof's errors (and a request the models refuse) inside as tool errors."""
    try:
        yield
    except (RayprofError, ValidationError) as e:
        raise tool_error(e) from e

