"""How each :class:`~orchestrator.models.api.ProfilingApi` operation a client sends over HTTP maps onto
the v1 API: method, path, where each argument goes, and what the answer is.

The one description of that mapping on the client's side: :class:`~orchestrator.client.http.HttpBackend`
is generic over it, and a test (tests/unit/test_client_transports.py) checks every entry against the
service's FastAPI routes (:mod:`orchestrator.service.app`), so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import read_lenient
from orchestrator.models.control import TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.summaries import GcReport, ProfilePage
from orchestrator.settings import MAX_HTTP_WAIT_S

__all__ = ["ANSWER", "ROUTES", "Route"]

# Answers are read leniently (orchestrator.models.common.read_lenient): a client may lag the service's release,
# and a ProfileView's own fields (status_url, manifest) are left out of its ProfileStatus.
ANSWER = "the service's answer"
"""What an answer that cannot be read is called in the error."""


def _status(body: dict[str, Any]) -> ProfileStatus:
    return read_lenient(ProfileStatus, body, source=ANSWER)


def _model(model: Any, key: str | None = None) -> Callable[[Any], Any]:
    """The answer as ``model`` (of the body's field ``key``, for the list views)."""
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    return lambda body: read_lenient(adapter, body if key is None else body[key], source=ANSWER)


def _dropped(body: Any) -> None:
    return None


@dataclass(frozen=True)
class Route:
    """One operation over HTTP. ``path`` fields are filled from the arguments of the same name."""

    method: str
    path: str
    answer: Callable[[Any], Any]
    """The operation's result from the response body."""
    query: Mapping[str, str] = field(default_factory=dict)
    """Query parameter -> argument; one that is None is left out, a list repeats the parameter."""
    body: str | tuple[str, ...] | None = None
    """The argument that is the JSON body (a model), or the arguments that make a JSON object."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Header -> argument; one that is None is left out."""
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Arguments as the service takes them, before anything is sent or timed."""

    def path_fields(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


def _bounded_wait(arguments: dict[str, Any]) -> dict[str, Any]:
    # The service holds a long poll at most MAX_HTTP_WAIT_S; ask for no more than it answers.
    return {**arguments, "timeout_s": max(0.0, min(arguments["timeout_s"], MAX_HTTP_WAIT_S))}


_PROFILE = "/v1/profiles/{profile_id}"
_WATCH = "/v1/watches/{watch_id}"

ROUTES: dict[str, Route] = {
    "submit": Route("POST", "/v1/profiles", _status, body="request", headers={"Idempotency-Key": "idempotency_key"}),
    "get": Route("GET", _PROFILE, _status),
    "wait": Route("GET", _PROFILE, _status, query={"wait_s": "timeout_s"}, prepare=_bounded_wait),
    "list": Route(
        "GET", "/v1/profiles", _model(ProfilePage), query={"target": "target", "state": "state", "limit": "limit", "offset": "offset"}
    ),
    # DELETE is the service's delete-or-cancel (the controller's ``remove``): a finished profile is deleted.
    "delete": Route("DELETE", _PROFILE, _dropped),
    "cancel": Route("DELETE", _PROFILE, _status),
    "gc": Route("POST", "/v1/gc", _model(GcReport), body="request"),
    "manifest": Route("GET", f"{_PROFILE}/manifest", _model(Manifest)),
    "profile_storage": Route("GET", f"{_PROFILE}/storage", _model(StorageSpec)),
    "targets": Route("GET", "/v1/targets", _model(list[TargetInfo], "targets")),
    "history": Route(
        "GET",
        "/v1/targets/{target}/history",
        _model(TargetHistory),
        query={"run": "run", "span_s": "span_s", "rank": "ranks", "max_points": "max_points"},
    ),
    # A POST: taking stacks acts on every rank and stores a bundle.
    "stacks": Route("POST", "/v1/targets/{target}/stacks", _model(StacksBundle), body=("native", "run")),
    "create_watch": Route("POST", "/v1/watches", _model(WatchStatus), body="spec"),
    "get_watch": Route("GET", _WATCH, _model(WatchStatus)),
    "list_watches": Route("GET", "/v1/watches", _model(list[WatchStatus], "watches")),
    "delete_watch": Route("DELETE", _WATCH, _model(WatchStatus)),
}
"""The operations a client sends over HTTP, by name; the rest (``read``, ``remove``, ``report_html``,
``config``, ...) are the service's own calls to the controller."""

