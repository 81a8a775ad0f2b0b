"""The client's two transports stay what the protocol and the service say, and the client's public
surface stays as recorded: ``ProfilingApi`` is the one list of operations, ``ROUTES`` the one
description of how each goes over HTTP (checked here against the service's OpenAPI document)."""

from __future__ import annotations

import inspect

import httpx
import pytest

from orchestrator.client import ProfileHandle, ProfilingClient
from orchestrator.client.http import HttpBackend
from orchestrator.client.routes import ROUTES
from orchestrator.errors import IncompatibleRecordError, InvalidRequestError
from orchestrator.models.api import OPERATIONS, ProfilingApi, bind, call_timeout, policy, repeatable
from orchestrator.service import app as service_app

# ProfilingClient and ProfileHandle as users call them: a change here is a change of the public API.
PUBLIC_SIGNATURES = [
    "ProfilingClient.__init__(self, url: 'str | None' = None, token: 'str | None' = None, *, backend: 'Transport | None' = None) -> 'None'",
    "ProfilingClient.delete(self, profile_id: 'str') -> 'None'",
    "ProfilingClient.delete_watch(self, watch_id: 'str') -> 'None'",
    "ProfilingClient.diff(self, a: 'str', b: 'str') -> 'ProfileDiff'",
    "ProfilingClient.gc(self, *, dry_run: 'bool' = False, grace_hours: 'float | None' = None) -> 'GcReport'",
    "ProfilingClient.get(self, profile_id: 'str') -> 'ProfileHandle'",
    "ProfilingClient.get_watch(self, watch_id: 'str') -> 'WatchStatus'",
    "ProfilingClient.history(self, target: 'str', *, run: 'str | None' = None, span_s: 'float' = 600.0, ranks: 'list[int] | None' = None, max_points: 'int' = 4096) -> 'TargetHistory'",
    "ProfilingClient.in_cluster(*, storage: 'str | None' = None, s3_endpoint_url: 'str | None' = None, s3_region: 'str | None' = None, address: 'str | None' = None, replace_controller: 'bool' = False) -> 'ProfilingClient'",
    "ProfilingClient.list(self, target: 'str | None' = None, state: 'ProfileState | str | None' = None, *, limit: 'int' = 100, offset: 'int' = 0) -> 'ProfilePage'",
    "ProfilingClient.profile(self, target: 'str', steps: 'int', *, idempotency_key: 'str | None' = None, **options: 'Any') -> 'ProfileHandle'",
    "ProfilingClient.stacks(self, target: 'str', *, native: 'bool' = False, run: 'str | None' = None) -> 'StacksBundle'",
    "ProfilingClient.targets(self) -> 'list[TargetInfo]'",
    "ProfilingClient.watch(self, target: 'str', **options: 'Any') -> 'WatchStatus'",
    "ProfilingClient.watches(self) -> 'list[WatchStatus]'",
    "ProfileHandle.__init__(self, backend: 'Transport', status: 'ProfileStatus') -> 'None'",
    "ProfileHandle.cancel(self) -> 'ProfileStatus'",
    "ProfileHandle.download(self, dest: 'str | Path') -> 'Path'",
    "ProfileHandle.manifest(self) -> 'Manifest'",
    "ProfileHandle.status(self) -> 'ProfileStatus'",
    "ProfileHandle.wait(self, timeout: 'float' = 300.0, progress: 'ProgressFn | None' = None) -> 'Manifest'",
]

# The v1 API's routes (docs/http.md): one may be added, none dropped or moved.
HTTP_ROUTES = [
    ("DELETE", "/v1/profiles/{profile_id}"),
    ("DELETE", "/v1/watches/{watch_id}"),
    ("GET", "/healthz"),
    ("GET", "/v1/profiles"),
    ("GET", "/v1/profiles/{a}/diff/{b}"),
    ("GET", "/v1/profiles/{profile_id}"),
    ("GET", "/v1/profiles/{profile_id}/artifacts/{key}"),
    ("GET", "/v1/profiles/{profile_id}/links"),
    ("GET", "/v1/profiles/{profile_id}/manifest"),
    ("GET", "/v1/profiles/{profile_id}/memory/{rank}"),
    ("GET", "/v1/profiles/{profile_id}/report"),
    ("GET", "/v1/profiles/{profile_id}/storage"),
    ("GET", "/v1/storage"),
    ("GET", "/v1/targets"),
    ("GET", "/v1/targets/{target}/history"),
    ("GET", "/v1/watches"),
    ("GET", "/v1/watches/{watch_id}"),
    ("POST", "/v1/gc"),
    ("POST", "/v1/profiles"),
    ("POST", "/v1/targets/{target}/stacks"),
    ("POST", "/v1/watches"),
]


def _openapi() -> dict:
    return service_app.api.openapi()


def test_the_clients_public_methods_are_as_recorded():
    found = []
    for cls in (ProfilingClient, ProfileHandle):
        for name, member in inspect.getmembers(cls):
            if (not name.startswith("_") or name == "__init__") and callable(member):
                found.append(f"{cls.__name__}.{name}{inspect.signature(member)}")

    assert sorted(found) == sorted(PUBLIC_SIGNATURES)


def test_the_http_api_has_its_recorded_routes():
    paths = _openapi()["paths"]

    assert sorted((method.upper(), path) for path, ops in paths.items() for method in ops) == HTTP_ROUTES


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_each_route_of_the_client_is_a_route_of_the_service_with_the_parameters_it_sends(name):
    route = ROUTES[name]
    operation = _openapi()["paths"][route.path][route.method.lower()]
    served = {(p["in"], p["name"]) for p in operation.get("parameters", [])}
    required = {(p["in"], p["name"]) for p in operation.get("parameters", []) if p.get("required")}
    sent = {("path", f) for f in route.path_fields()} | {("query", q) for q in route.query}
    sent |= {("header", h) for h in route.headers}

    assert name in OPERATIONS
    assert sent <= served, sent - served
    assert required <= sent, required - sent
    assert (route.body is not None) == ("requestBody" in operation)
    # Every argument of the operation goes somewhere, and only arguments are named.
    used = set(route.path_fields()) | set(route.query.values()) | set(route.headers.values())
    used |= {route.body} if isinstance(route.body, str) else set(route.body or ())
    assert used == set(bind(name, *_arguments(name))), used


def _arguments(name: str) -> tuple[tuple, dict]:
    """Placeholder arguments for every required parameter of ``name``."""
    params = list(inspect.signature(getattr(ProfilingApi, name)).parameters.values())[1:]
    return tuple(None for p in params if p.default is inspect.Parameter.empty), {}


def test_an_operation_the_service_keeps_to_itself_is_refused_by_the_http_client():
    backend = HttpBackend("http://svc", transport=httpx.MockTransport(lambda r: httpx.Response(500)))

    with pytest.raises(InvalidRequestError, match="'report_html' is the service's own"):
        backend.call("report_html", "p1")


# Timeouts (s) and retries each transport used before the policies were data: unchanged.
_BEFORE = {
    # name: (in-cluster client's timeout, retried, service's timeout)
    "get": (60.0, True, 30.0),
    "wait": (5.0 + 30.0, False, None),
    "read": (None, True, 7.0 + 30.0),
    "list": (60.0, True, 30.0),
    "cancel": (60.0, False, None),
    "delete": (60.0, False, None),
    "gc": (600.0, False, 600.0),
    "manifest": (60.0, True, 30.0),
    "profile_storage": (60.0, True, 30.0),
    "targets": (60.0, True, 30.0),
    "history": (60.0, True, 30.0),
    "stacks": (120.0, False, 90.0),
    "create_watch": (60.0, False, 30.0),
    "get_watch": (60.0, True, 30.0),
    "list_watches": (60.0, True, 30.0),
    "delete_watch": (60.0, False, 30.0),
    "config": (60.0, True, 30.0),
    "ping": (None, True, 5.0),  # a read: sent again to a controller that replaced a gone one
}


@pytest.mark.parametrize("name", sorted(_BEFORE))
def test_each_operation_keeps_its_timeouts_and_retries(name):
    from orchestrator.client.ray_backend import CALL_TIMEOUT_S as CLIENT_S
    from orchestrator.client.ray_backend import POLL_MARGIN_S
    from orchestrator.service.controller_link import CALL_TIMEOUT_S as SERVICE_S

    arguments = {"timeout_s": 5.0, "wait_s": 7.0}
    client_s, retried, service_s = _BEFORE[name]
    if client_s is not None:
        assert call_timeout(name, arguments, CLIENT_S, POLL_MARGIN_S) == client_s
    if service_s is not None:
        assert call_timeout(name, arguments, SERVICE_S) == service_s
    assert repeatable(name, arguments) == retried


def test_a_submit_is_retried_only_with_an_idempotency_key():
    assert policy("submit").idempotent == "idempotency_key"
    assert repeatable("submit", {"idempotency_key": "k"}) and not repeatable("submit", {"idempotency_key": None})


def test_the_http_client_times_a_long_poll_by_its_wait_and_a_stacks_call_by_the_ranks_it_asks():
    assert call_timeout("wait", {"timeout_s": 10.0}, 30.0) == 40.0
    assert call_timeout("stacks", {}, 30.0) == 90.0
    assert call_timeout("gc", {}, 30.0) == 600.0


def test_the_http_client_sends_each_argument_where_its_route_says():
    from orchestrator.models.requests import ProfileState

    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.path.endswith("/storage"):
            return httpx.Response(200, json={"uri": "s3://bucket/old"})
        return httpx.Response(200, json={"profiles": [], "total": 0, "limit": 5, "offset": 0})

    backend = HttpBackend("http://svc", s3_endpoint_url="http://minio:9000", transport=httpx.MockTransport(answer))
    client = ProfilingClient(backend=backend)
    client.list("run", ProfileState.DONE, limit=5)
    storage = backend.call("profile_storage", "a/b")
    # The answers are no history and no bundle: the requests are what this test looks at.
    with pytest.raises(IncompatibleRecordError):
        client.history("run", ranks=[0, 1])
    with pytest.raises(IncompatibleRecordError):
        client.stacks("run", native=True)

    assert [(r.method, r.url.raw_path.decode().split("?")[0], r.url.query.decode()) for r in sent] == [
        ("GET", "/v1/profiles", "target=run&state=DONE&limit=5&offset=0"),
        ("GET", "/v1/profiles/a%2Fb/storage", ""),
        ("GET", "/v1/targets/run/history", "span_s=600.0&rank=0&rank=1&max_points=4096"),
        ("POST", "/v1/targets/run/stacks", ""),
    ]
    assert sent[-1].content == b'{"native":true,"run":null}'
    assert storage.uri == "s3://bucket/old" and storage.s3_endpoint_url == "http://minio:9000"
