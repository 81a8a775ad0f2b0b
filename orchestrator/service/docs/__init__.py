"""The API docs page (``/docs``): Swagger UI from files shipped with a Python package.

FastAPI's own page loads Swagger UI from a CDN on the console's origin, where
the console keeps the token in ``sessionStorage``: a changed script there could
read it, and an offline cluster shows a blank page. This page loads Swagger UI
5 (the schema is OpenAPI 3.1, which Swagger UI 4 cannot show) from the files
the ``fastapi-offline`` package ships (installed with rayprof; only its static
files are used) and this folder's ``index.html`` and ``init.js``, under the
console's Content-Security-Policy, so nothing outside the service is
referenced or run.

The page itself holds nothing secret and needs no token; the schema it loads
(``/openapi.json``) is served behind the same guard as every API route, and
``init.js`` sends the token the console keeps for the tab.
"""

# No ``from __future__ import annotations``: Serve's class-based ingress needs
# real annotations on route signatures (see orchestrator/service/app.py).
from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from orchestrator.errors import NotFoundError
from orchestrator.service.console import CONSOLE_CSP

__all__ = ["router"]

# Only what the page loads: never the whole vendor folder (source maps, other bundles).
_SWAGGER_FILES = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
}
_OWN_FILES = {"init.js": "text/javascript; charset=utf-8"}
_HEADERS = {
    "Content-Security-Policy": CONSOLE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter()


@cache
def _read(name: str) -> bytes:
    if name in _SWAGGER_FILES:
        return resources.files("fastapi_offline").joinpath("static", name).read_bytes()
    return resources.files(__name__).joinpath(name).read_bytes()


def _file(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=_HEADERS)


@router.get("/docs", include_in_schema=False)
async def docs_page() -> Response:
    return _file("index.html", "text/html; charset=utf-8")


@router.get("/docs/{name}", include_in_schema=False)
async def docs_file(name: str) -> Response:
    media_type = _OWN_FILES.get(name) or _SWAGGER_FILES.get(name)
    if media_type is None:
        raise NotFoundError(f"no docs file {name!r}")
    return _file(name, media_type)
