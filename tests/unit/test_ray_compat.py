"""orchestrator/ray_compat.py on the Ray release this environment has (`make test`: the newest;
`make test-oldest-ray`: 2.43). Unit tests: no cluster."""

from __future__ import annotations

import inspect

import pytest
import ray
import ray.exceptions
from fastapi import APIRouter, FastAPI
from fastapi.params import Depends
from fastapi.routing import APIRoute

from orchestrator.ray_compat import agent_forgets_idle_gauges, auth_errors, ingress


def test_auth_errors_is_rays_refusal_where_the_release_has_token_auth():
    refusal = getattr(ray.exceptions, "AuthenticationError", None)
    assert auth_errors() == ((refusal,) if refusal else ())
    try:
        raise RuntimeError("not about auth")
    except auth_errors():  # an empty tuple matches nothing: the clause is safe on every release
        raise AssertionError("matched an unrelated error") from None
    except RuntimeError:
        pass


def test_routes_of_a_mixin_are_bound_to_the_deployment_on_this_serve():
    # Serve 2.43-2.52 bind a route only if its function's name holds the class's; the mixin's would
    # stay unbound and ask the client for `self`.
    router = APIRouter()

    class Mixin:
        @router.get("/mixin")
        async def from_mixin(self) -> dict:
            return {}

    app = FastAPI()
    app.include_router(router)

    @ingress(app)
    class Service(Mixin):
        @app.get("/own")
        async def own(self) -> dict:
            return {}

    # Serve re-mounts the routes it binds on the app itself (a frozen copy goes to the replicas).
    routes = {r.path: r for r in _api_routes(app)}
    for path in ("/mixin", "/own"):
        self_param = inspect.signature(routes[path].endpoint).parameters["self"]
        assert isinstance(self_param.default, Depends), path


def _api_routes(app: FastAPI) -> list[APIRoute]:
    found, stack = [], list(app.routes)
    while stack:
        route = stack.pop()
        if isinstance(route, APIRoute):
            found.append(route)
        stack.extend(getattr(getattr(route, "original_router", None), "routes", []))
    return found


def test_the_metrics_agent_forgets_idle_gauges_on_the_newest_ray_and_not_on_the_oldest():
    # Ray 2.43 exports a gauge for the life of the process that set it (the controller then sets its
    # gauges in a process it replaces); 2.60's OpenTelemetry agent drops one not set for two export periods.
    version = tuple(int(part) for part in ray.__version__.split(".")[:2])
    if (2, 44) <= version < (2, 60):
        pytest.skip(f"Ray {ray.__version__}: the boundary between the two was not tried")
    assert agent_forgets_idle_gauges() is (version >= (2, 60))
