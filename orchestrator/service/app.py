"""The rayprof HTTP service: a Ray Serve deployment with a FastAPI ingress.

Thin on purpose (the FastAPI app itself, its error handlers and shared parameter
types are in :mod:`orchestrator.service.api`): each route validates its input, makes one call to the
control actor through the Ray transport (:class:`actors.controller.rpc.ControllerRpc`), naming the
operation by its :class:`~orchestrator.models.api.ProfilingApi` method, and maps the answer or error to
HTTP. The client's side of each route is its entry in :data:`orchestrator.client.routes.ROUTES`. Every error is JSON ``{"error": code, "detail": message}``.

Deploy with ``rayprof serve``, ``serve run deploy/serve_config.yaml``, or in
Python::

    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app({"storage": "s3://bucket/prefix"}), name="rayprof")
"""

# No ``from __future__ import annotations`` here: Serve's class-based ingress
# rebuilds route signatures and cannot resolve string annotations, so FastAPI
# would treat the body, Request and dependencies as query parameters.
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from ray import serve

from orchestrator.auth import check_exposure, read_token
from orchestrator.config import mcp_read_only as resolve_mcp_read_only
from orchestrator.config import storage_spec
from orchestrator.errors import (
    ControllerUnavailableError,
    NotFoundError,
)
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.api import Operation
from orchestrator.models.api import ProfilingApi as Api
from orchestrator.models.common import NAME_MAX_LENGTH, NAME_PATTERN
from orchestrator.models.control import no_targets_note
from orchestrator.models.diagnosis import StacksBundle, WatchSpec, WatchStatus
from orchestrator.models.history import TargetHistory
from orchestrator.models.profile import Manifest
from orchestrator.models.reads import ProfileRead
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.models.summaries import GcReport, GcRequest, ProfilePage
from orchestrator.ray_compat import ingress
from orchestrator.service.api import Credentials, IdempotencyKeyHeader, ProfileId, api
from orchestrator.service.console import ConsoleRoutes
from orchestrator.service.controller_link import ControllerLink
from orchestrator.service.security import REPORT_HEADERS, Guard, serve_http_host
from orchestrator.service.views import ProfileView, StacksRequest, StorageView, TargetList, WatchList
from orchestrator.settings import (
    DEFAULT_HISTORY_MAX_POINTS,
    DEFAULT_HISTORY_SPAN_S,
    DEFAULT_PAGE_SIZE,
    MAX_HISTORY_MAX_POINTS,
    MAX_HISTORY_SPAN_S,
    MAX_HTTP_WAIT_S,
    MAX_PAGE_SIZE,
)

__all__ = [
    "ProfileView",
    "ProfilingService",
    "StorageView",
    "TargetList",
    "api",
    "app",
    "build_app",
]

P = ParamSpec("P")
R = TypeVar("R")

# Everything the routes use (handlers, middleware, helpers) is defined above the
# class: @ingress (serve.ingress) pickles the FastAPI app, route methods included, when the
# class is decorated; a global defined later is missing in the replica.
@serve.deployment(
    # The service only forwards calls: leave every CPU to training.
    ray_actor_options={"num_cpus": 0},
    # Long-polls (?wait_s=) hold a request each; the default of 5 would starve others.
    max_ongoing_requests=200,
)
@ingress(api)
class ProfilingService(ConsoleRoutes):
    """Routes of the v1 API; the control actor does the work.

    ``storage``: when given, the control actor is (created and) configured to
    store new profiles there. ``token``: bearer token required on every route
    but ``/healthz`` (default ``RAYPROF_TOKEN_FILE`` or ``RAYPROF_TOKEN``; none
    means open to loopback Host names and ``allowed_hosts``). ``insecure``:
    accept a non-loopback bind without a token. ``controller``: a control-actor
    handle to use instead of the named one. ``mcp_read_only``: ``/mcp`` leaves out
    the acting tools (default ``RAYPROF_MCP_READ_ONLY``, read in the replica).
    """

    def __init__(
        self,
        *,
        storage: StorageSpec | None = None,
        token: str | None = None,
        controller: Any = None,
        insecure: bool = False,
        allowed_hosts: tuple[str, ...] = (),
        mcp_read_only: bool | None = None,
    ) -> None:
        token = read_token(token)
        # Also checked here, not only at build time: ``app`` and Python callers have no builder.
        check_exposure(serve_http_host(), token, insecure=insecure)
        self._guard = Guard(token, allowed_hosts)
        self._mcp_read_only = resolve_mcp_read_only(mcp_read_only)
        self._link = ControllerLink(storage, controller)
        self._mcp_endpoint: Any = None  # orchestrator.mcp.http.McpEndpoint, made on the first /mcp request
        if controller is None:
            # Create the control actor now, not on the first request: agents only
            # discover an existing one, so jobs can register as soon as we are up.
            self._link.connect()

    async def _ask(self, op: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """One call of ``op`` to the control actor (:class:`~orchestrator.service.controller_link.ControllerLink`)."""
        return await self._link.ask(op, *args, **kwargs)

    def _view(self, read: ProfileRead, request: Request) -> ProfileView:
        if read.deleted:
            url = str(request.url)
        else:
            url = str(request.url_for("get_profile", profile_id=read.status.id))
        return ProfileView(**dict(read.status), status_url=url, manifest=read.manifest)

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi_schema(self, request: Request, credentials: Credentials) -> JSONResponse:
        self._guard.check(request, credentials)
        return JSONResponse(api.openapi())

    @api.get("/healthz", summary="Liveness: the service and its control actor answer, with the build they run")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok", "build": await self._ask(Api.ping)}

    @api.post("/v1/profiles", status_code=202, response_model=ProfileView, summary="Start a profile")
    async def create_profile(
        self, body: ProfileRequest, request: Request, credentials: Credentials, idempotency_key: IdempotencyKeyHeader = None
    ) -> JSONResponse:
        self._guard.check(request, credentials)
        status = await self._ask(Api.submit, body, idempotency_key)
        # A finished profile (an idempotent retry after it ended) is answered with its manifest, as GET does.
        read = await self._ask(Api.read, status.id) if status.state.is_terminal else ProfileRead(status=status)
        view = self._view(read, request)
        return JSONResponse(view.model_dump(mode="json"), status_code=202, headers={"Location": view.status_url})

    @api.get("/v1/profiles", response_model=ProfilePage, summary="One page of profiles, newest first")
    async def list_profiles(
        self,
        request: Request,
        credentials: Credentials,
        target: Annotated[str | None, Query(max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)] = None,
        state: ProfileState | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> ProfilePage:
        self._guard.check(request, credentials)
        return await self._ask(Api.list, target, state, limit, offset)

    @api.get("/v1/profiles/{profile_id}", response_model=ProfileView, summary="State, per-rank progress, manifest")
    async def get_profile(
        self,
        profile_id: ProfileId,
        request: Request,
        credentials: Credentials,
        wait_s: Annotated[
            float, Query(ge=0, le=MAX_HTTP_WAIT_S, description="Long-poll: answer once the state changes or after this.")
        ] = 0.0,
    ) -> ProfileView:
        self._guard.check(request, credentials)
        return self._view(await self._ask(Api.read, profile_id, wait_s), request)

    @api.delete(
        "/v1/profiles/{profile_id}",
        response_model=ProfileView,
        summary="Cancel a running profile; delete a finished one (its files and its record)",
    )
    async def cancel_profile(self, profile_id: ProfileId, request: Request, credentials: Credentials) -> ProfileView:
        self._guard.check(request, credentials)
        return self._view(await self._ask(Api.remove, profile_id), request)

    @api.post("/v1/gc", response_model=GcReport, summary="Apply retention now and delete leftover folders")
    async def collect_garbage(self, body: GcRequest, request: Request, credentials: Credentials) -> GcReport:
        self._guard.check(request, credentials)
        return await self._ask(Api.gc, body)

    @api.get("/v1/profiles/{profile_id}/manifest", response_model=Manifest, summary="The stored manifest")
    async def get_manifest(self, profile_id: ProfileId, request: Request, credentials: Credentials) -> Manifest:
        self._guard.check(request, credentials)
        return await self._ask(Api.manifest, profile_id)

    @api.get(
        "/v1/profiles/{profile_id}/report",
        response_class=HTMLResponse,
        summary="The analysis report (report.html) listed in the manifest, under a strict Content-Security-Policy",
    )
    async def get_report(self, profile_id: ProfileId, request: Request, credentials: Credentials) -> HTMLResponse:
        self._guard.check(request, credentials)
        data = await self._ask(Api.report_html, profile_id)
        return HTMLResponse(data.decode("utf-8", errors="replace"), headers=REPORT_HEADERS)

    @api.get(
        "/v1/storage",
        response_model=StorageView,
        summary="Where new profiles are stored (where one profile is: GET /v1/profiles/{profile_id}/storage)",
    )
    async def get_storage(self, request: Request, credentials: Credentials) -> StorageView:
        self._guard.check(request, credentials)
        config = await self._ask(Api.config)
        return StorageView(uri=config.storage.uri)

    @api.get(
        "/v1/profiles/{profile_id}/storage",
        response_model=StorageView,
        summary="Where this profile's files are: the storage its record names, which a reconfigure does not move",
    )
    async def get_profile_storage(self, profile_id: ProfileId, request: Request, credentials: Credentials) -> StorageView:
        self._guard.check(request, credentials)
        storage = await self._ask(Api.profile_storage, profile_id)
        return StorageView(uri=storage.uri)

    @api.get("/v1/targets", response_model=TargetList, summary="Live training runs and their ranks")
    async def list_targets(self, request: Request, credentials: Credentials) -> TargetList:
        self._guard.check(request, credentials)
        targets = await self._ask(Api.targets)
        return TargetList(targets=targets, note=no_targets_note(len(targets)))

    @api.post(
        "/v1/targets/{target}/stacks",
        status_code=201,
        response_model=StacksBundle,
        summary="Take every live rank's stacks now, grouped; stored as a bundle of kind 'stacks'",
        description="A POST, never a GET: it acts on every rank and stores a bundle, so no link or image "
        "can trigger it. Read a stored bundle with GET /v1/profiles/{id} (the Location header).",
    )
    async def take_stacks(
        self, target: ProfileId, request: Request, credentials: Credentials, body: StacksRequest | None = None
    ) -> JSONResponse:
        self._guard.check(request, credentials)
        stacks = body or StacksRequest()
        bundle = await self._ask(Api.stacks, target, stacks.native, stacks.run)
        location = str(request.url_for("get_profile", profile_id=bundle.id))
        return JSONResponse(bundle.model_dump(mode="json"), status_code=201, headers={"Location": location})

    @api.get(
        "/v1/targets/{target}/history",
        response_model=TargetHistory,
        summary="A run's step-time history per rank, at the finest resolution kept for the span",
    )
    async def get_history(
        self,
        target: ProfileId,
        request: Request,
        credentials: Credentials,
        run: Annotated[str | None, Query(max_length=NAME_MAX_LENGTH)] = None,
        span_s: Annotated[float, Query(gt=0, le=MAX_HISTORY_SPAN_S)] = DEFAULT_HISTORY_SPAN_S,
        rank: Annotated[list[int] | None, Query(description="Only these ranks (repeat the parameter).")] = None,
        max_points: Annotated[
            int,
            Query(
                ge=2 * 60,
                le=MAX_HISTORY_MAX_POINTS,
                description="Most points in the answer, every rank together; past it, per-bucket min/median/max "
                "of the slowest ranks and a band of every rank.",
            ),
        ] = DEFAULT_HISTORY_MAX_POINTS,
    ) -> TargetHistory:
        self._guard.check(request, credentials)
        return await self._ask(Api.history, target, run, span_s, rank, max_points)

    @api.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
    async def mcp(self, request: Request, credentials: Credentials) -> Response:
        """The MCP server (streamable HTTP), under the same token, Host and Origin rules as the API."""
        self._guard.check(request, credentials)
        if self._link.handle is None:
            self._link.connect()
        return self._mcp_response(request)

    def _mcp_response(self, request: Request) -> Response:
        try:
            from orchestrator.mcp.http import McpEndpoint, McpResponse
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] != "mcp":
                raise
            raise NotFoundError("this service has no MCP server: install rayprof[mcp] where it runs") from None
        if self._mcp_endpoint is None:
            from orchestrator.client import ProfilingClient
            from orchestrator.client.ray_backend import ActorBackend

            def client() -> ProfilingClient:
                handle = self._link.handle
                if handle is None:
                    raise ControllerUnavailableError("the control actor is not connected yet: retry")
                return ProfilingClient(backend=ActorBackend(handle))

            self._mcp_endpoint = McpEndpoint(client, read_only=self._mcp_read_only)
        return McpResponse(self._mcp_endpoint, request)

    @api.post("/v1/watches", status_code=201, response_model=WatchStatus, summary="Watch a target; act when it holds")
    async def create_watch(self, body: WatchSpec, request: Request, credentials: Credentials) -> WatchStatus:
        self._guard.check(request, credentials)
        return await self._ask(Api.create_watch, body)

    @api.get("/v1/watches", response_model=WatchList, summary="Every watch")
    async def list_watches(self, request: Request, credentials: Credentials) -> WatchList:
        self._guard.check(request, credentials)
        return WatchList(watches=await self._ask(Api.list_watches))

    @api.get("/v1/watches/{watch_id}", response_model=WatchStatus, summary="One watch: state, baseline, firings")
    async def get_watch(self, watch_id: ProfileId, request: Request, credentials: Credentials) -> WatchStatus:
        self._guard.check(request, credentials)
        return await self._ask(Api.get_watch, watch_id)

    @api.delete("/v1/watches/{watch_id}", response_model=WatchStatus, summary="Stop and forget a watch")
    async def delete_watch(self, watch_id: ProfileId, request: Request, credentials: Credentials) -> WatchStatus:
        self._guard.check(request, credentials)
        return await self._ask(Api.delete_watch, watch_id)


_APP_ARGS = {"storage", "s3_endpoint_url", "s3_region", "token", "insecure", "allowed_hosts", "mcp_read_only"}


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder (``import_path: orchestrator.service.app:build_app``).

    ``args``: ``storage`` (path or ``s3://bucket/prefix``), ``s3_endpoint_url``,
    ``s3_region``, ``token``, ``insecure`` (serve on a non-loopback address
    without a token), ``allowed_hosts`` (Host names answered without a token,
    besides loopback), ``mcp_read_only`` (``/mcp`` without the tools that act on
    jobs); unset ones fall back to ``RAYPROF_*`` env vars.

    Raises :class:`~orchestrator.errors.ConfigurationError` here, at build time,
    when Serve listens on a non-loopback address and no token is configured
    (argument, ``RAYPROF_TOKEN_FILE`` or ``RAYPROF_TOKEN``) unless ``insecure``,
    and when ``mcp_read_only`` or ``RAYPROF_MCP_READ_ONLY`` is not a flag.
    """
    args = dict(args or {})
    unknown = set(args) - _APP_ARGS
    if unknown:
        raise ValueError(f"unknown rayprof app args: {sorted(unknown)}")
    insecure = bool(args.get("insecure", False))
    token = args.get("token")
    check_exposure(serve_http_host(), read_token(token), insecure=insecure)
    # Resolved here, where `rayprof serve` runs with the user's environment, not in the replica.
    read_only = resolve_mcp_read_only(args.get("mcp_read_only"))
    storage = None
    if args.get("storage"):
        storage = storage_spec(
            args["storage"], args.get("s3_endpoint_url"), args.get("s3_region"), endpoint_from="s3_endpoint_url"
        )
    hosts = args.get("allowed_hosts") or ()
    return ProfilingService.bind(
        storage=storage,
        token=token,
        insecure=insecure,
        allowed_hosts=tuple([hosts] if isinstance(hosts, str) else hosts),
        mcp_read_only=read_only,
    )


app = ProfilingService.bind()
"""The service configured entirely by ``RAYPROF_*`` env vars (``import_path: orchestrator.service.app:app``)."""
