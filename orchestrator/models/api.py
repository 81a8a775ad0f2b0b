"""``ProfilingApi``: every operation a client asks of rayprof, written once.

The control actor (:class:`actors.controller.actor.Controller`) implements it with these
async methods; two transports carry it and restate none of it: the Ray proxy
(:class:`actors.controller.rpc.ControllerRpc`, the service and the in-cluster client
:class:`orchestrator.client.ray_backend.ActorBackend`) sends ``name(*args)`` to the actor, and the HTTP
client (:class:`orchestrator.client.http.HttpBackend`) maps it through its route table
(:mod:`orchestrator.client.routes`). As httpx puts its seam at the transport, a caller names the
operation by the protocol's method, ``call(ProfilingApi.get, profile_id)``, and gets its result
type: adding an operation is the controller's method, its line here and its route.

How long a call may take and whether a transport may repeat it is a fact of the operation,
held here as data (:func:`policy`), never as per-method code in a transport.
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig, TargetInfo
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest, ProfileStatus
from orchestrator.models.reads import ProfileRead
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage
from orchestrator.settings import DEFAULT_HISTORY_MAX_POINTS, DEFAULT_HISTORY_SPAN_S

__all__ = ["OPERATIONS", "CallPolicy", "Operation", "ProfilingApi", "bind", "call_timeout", "policy", "repeatable"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class CallPolicy:
    """How a transport treats one operation's calls."""

    idempotent: bool | str = False
    """True: safe to repeat (a read), so a transport rides out a controller restart by retrying;
    the name of an argument: safe to repeat when that argument is given (a submit's idempotency key)."""
    wait_arg: str | None = None
    """A long poll: the call may take this argument's seconds, plus the transport's margin."""
    extra_s: float = 0.0
    """Slower than a plain call by this much (it acts on every rank)."""
    limit_s: float | None = None
    """A fixed limit in place of the transport's (deleting many folders; a liveness check)."""


_READ = CallPolicy(idempotent=True)
_POLICY = "__rayprof_policy__"


def _policy(p: CallPolicy) -> Callable[[F], F]:
    def mark(method: F) -> F:
        setattr(method, _POLICY, p)
        return method

    return mark


class ProfilingApi(Protocol):
    """The client operations of the control actor (what each does: the controller's method).

    ``builtins.list`` in annotations: the operation ``list`` names ``list`` in this class's body."""

    @_policy(CallPolicy(idempotent=True, limit_s=5.0))
    async def ping(self) -> str: ...
    async def configure(self, storage: StorageSpec) -> None: ...
    @_policy(_READ)
    async def config(self) -> ControllerConfig: ...
    @_policy(CallPolicy(idempotent="idempotency_key"))
    async def submit(self, request: ProfileRequest, idempotency_key: str | None = None) -> ProfileStatus: ...
    @_policy(_READ)
    async def get(self, profile_id: str) -> ProfileStatus: ...
    @_policy(CallPolicy(wait_arg="timeout_s"))
    async def wait(self, profile_id: str, timeout_s: float) -> ProfileStatus: ...
    @_policy(CallPolicy(idempotent=True, wait_arg="wait_s"))
    async def read(self, profile_id: str, wait_s: float = 0.0) -> ProfileRead: ...
    @_policy(_READ)
    async def list(
        self, target: str | None = None, state: ProfileState | None = None, limit: int = 100, offset: int = 0
    ) -> ProfilePage: ...
    async def cancel(self, profile_id: str) -> ProfileStatus: ...
    async def delete(self, profile_id: str) -> None: ...
    async def remove(self, profile_id: str) -> ProfileRead: ...
    @_policy(CallPolicy(limit_s=600.0))
    async def gc(self, request: GcRequest) -> GcReport: ...
    @_policy(_READ)
    async def manifest(self, profile_id: str) -> Manifest: ...
    @_policy(_READ)
    async def report_html(self, profile_id: str) -> bytes: ...
    @_policy(_READ)
    async def profile_storage(self, profile_id: str) -> StorageSpec: ...
    @_policy(_READ)
    async def targets(self) -> builtins.list[TargetInfo]: ...
    @_policy(_READ)
    async def history(
        self,
        target: str,
        run: str | None = None,
        span_s: float = DEFAULT_HISTORY_SPAN_S,
        ranks: builtins.list[int] | None = None,
        max_points: int = DEFAULT_HISTORY_MAX_POINTS,
    ) -> TargetHistory: ...
    @_policy(CallPolicy(extra_s=60.0))
    async def stacks(self, target: str, native: bool = False, run: str | None = None) -> StacksBundle: ...
    async def create_watch(self, spec: WatchSpec) -> WatchStatus: ...
    @_policy(_READ)
    async def get_watch(self, watch_id: str) -> WatchStatus: ...
    @_policy(_READ)
    async def list_watches(self) -> builtins.list[WatchStatus]: ...
    async def delete_watch(self, watch_id: str) -> WatchStatus: ...


Operation = Callable[Concatenate[ProfilingApi, P], Awaitable[R]]
"""An operation, named by the protocol's method (``ProfilingApi.get``): its parameters and its result type."""

OPERATIONS: frozenset[str] = frozenset(
    name for name, member in vars(ProfilingApi).items() if inspect.iscoroutinefunction(member)
)
"""The names of every operation: what a transport may send."""


def policy(name: str) -> CallPolicy:
    """The call policy of operation ``name`` (a plain write: no retry, the transport's time)."""
    if name not in OPERATIONS:
        raise AttributeError(f"ProfilingApi has no operation {name!r}")
    found: CallPolicy = getattr(getattr(ProfilingApi, name), _POLICY, CallPolicy())
    return found


def bind(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by parameter name, defaults filled in (raises ``TypeError`` as the call would)."""
    if name not in OPERATIONS:
        raise AttributeError(f"ProfilingApi has no operation {name!r}")
    bound = inspect.signature(getattr(ProfilingApi, name)).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return dict(list(bound.arguments.items())[1:])


def call_timeout(name: str, arguments: dict[str, Any], base_s: float, poll_margin_s: float | None = None) -> float:
    """How long a transport whose plain call may take ``base_s`` waits for one call of ``name``
    (a long poll: its wait plus ``poll_margin_s``, default ``base_s``)."""
    p = policy(name)
    if p.limit_s is not None:
        return p.limit_s
    if p.wait_arg is not None:
        return float(arguments[p.wait_arg]) + (base_s if poll_margin_s is None else poll_margin_s)
    return base_s + p.extra_s


def repeatable(name: str, arguments: dict[str, Any]) -> bool:
    """Whether a call of ``name`` with ``arguments`` is safe to send again after a lost answer."""
    idempotent = policy(name).idempotent
    return idempotent if isinstance(idempotent, bool) else arguments.get(idempotent) is not None
