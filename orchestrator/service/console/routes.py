"""The console's routes: its static files, the artifact links a browser can open, and the
views only the console asks for (a diff, a memory timeline).

A browser cannot put a bearer header on an ``<iframe src>`` or a download
link, so ``/v1/profiles/{id}/links`` (bearer required) answers URLs signed
with an HMAC under a key derived from the service token
(:func:`~orchestrator.service.security.link_key`) that expire after ``LINK_TTL_S``; the
artifact route accepts either. Without a token on the service the URLs are
plain, as the API is open.

``ConsoleRoutes`` is a mixin of the Serve ingress class (its routes need the
control actor); ``router`` holds both them and the static routes, and
:mod:`orchestrator.service.api` includes it.
"""

# No ``from __future__ import annotations``: Serve's class-based ingress needs
# real annotations on route signatures (see orchestrator/service/app.py).
import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.diff import ProfileDiff
from orchestrator.analysis.memory_chart import downsample, parse_timeline
from orchestrator.analysis.report import IDLE_COLORS
from orchestrator.errors import IntegrityError, NotFoundError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.api import ProfilingApi as Api
from orchestrator.models.common import NAME_MAX_LENGTH, NAME_PATTERN
from orchestrator.models.profile import Artifact, ArtifactKind, Manifest
from orchestrator.service.security import FRAMED_REPORT_CSP, Guard

__all__ = ["CONSOLE_CSP", "LINK_TTL_S", "ArtifactLink", "ConsoleRoutes", "ProfileLinks", "router", "sign"]

LINK_TTL_S = 15 * 60
"""How long a signed artifact URL works."""
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_JS = "text/javascript; charset=utf-8"
_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": _JS,
    "targets.js": _JS,
    "history.js": _JS,
    "profile.js": _JS,
    "stacks.js": _JS,
    "watches.js": _JS,
    "compare.js": _JS,
    "app.css": "text/css; charset=utf-8",
}
# The device-idle bars' colours, made from the report's so that both show a cause in one colour.
IDLE_CSS = "".join(f".idle-{key}{{fill:{color};background:{color}}}\n" for key, color in IDLE_COLORS.items())
ProfileId = Annotated[str, Path(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)]

router = APIRouter()
_bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class ArtifactLink(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ArtifactKind
    key: str
    rank: int | None
    bytes: int
    url: str = Field(description="GET it with no header; signed when the service has a token.")


class ProfileLinks(BaseModel):
    """``GET /v1/profiles/{id}/links``: URLs a browser can open without a bearer header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expires_at: float | None = Field(description="Unix time the signed URLs stop working; None when unsigned.")
    report: str | None
    artifacts: list[ArtifactLink]


def sign(link_key: bytes, profile_id: str, key: str, expires: int) -> str:
    """HMAC of one artifact path and its expiry, under the service's link key (never the raw token)."""
    return hmac.new(link_key, f"{profile_id}/{key}@{expires}".encode(), hashlib.sha256).hexdigest()


def _static(name: str) -> Response:
    body = resources.files("orchestrator.service.console").joinpath(name).read_bytes()
    return _answer(body, _STATIC[name])


def _answer(body: bytes, media_type: str) -> Response:
    headers = {
        "Content-Security-Policy": CONSOLE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return Response(body, media_type=media_type, headers=headers)


@router.get("/", include_in_schema=False)
async def console_index() -> Response:
    return _static("index.html")


@router.get("/console/idle.css", include_in_schema=False)
async def console_idle_css() -> Response:
    return _answer(IDLE_CSS.encode(), "text/css; charset=utf-8")


@router.get("/console/{name}", include_in_schema=False)
async def console_file(name: str) -> Response:
    if name not in _STATIC:
        raise NotFoundError(f"no console file {name!r}")
    return _static(name)


def _find(manifest: Manifest, key: str) -> tuple[Artifact, int | None]:
    for rank in manifest.ranks:
        for artifact in rank.artifacts:
            if artifact.key == key:
                return artifact, rank.rank
    for artifact in manifest.artifacts:
        if artifact.key == key:
            return artifact, None
    raise NotFoundError(f"profile {manifest.profile_id} lists no artifact {key!r}", profile_id=manifest.profile_id)


class ConsoleRoutes:
    """Routes of :class:`~orchestrator.service.app.ProfilingService` that the console adds."""

    _guard: Guard
    # The service's one way to the control actor (orchestrator.service.app): ``_ask(Api.manifest, profile_id)``.
    _ask: Callable[..., Awaitable[Any]]

    async def _manifest_bytes(self, manifest: Manifest, artifact: Artifact) -> bytes:
        from orchestrator.manifest import read_artifact
        from orchestrator.storage import open_storage

        # The storage the profile's record names: earlier profiles stay where they were written.
        storage: StorageSpec = await self._ask(Api.profile_storage, manifest.profile_id)
        return await asyncio.to_thread(read_artifact, open_storage(storage), manifest, artifact.key, artifact.sha256)

    def _signed_ok(self, profile_id: str, key: str, expires: int | None, signature: str | None) -> bool:
        link_key = self._guard.link_key
        if link_key is None or expires is None or signature is None or expires < time.time():
            return False
        return hmac.compare_digest(sign(link_key, profile_id, key, expires), signature)

    @router.get("/v1/profiles/{a}/diff/{b}", response_model=ProfileDiff, summary="Compare profile b with profile a")
    async def diff_profiles(
        self, a: ProfileId, b: ProfileId, request: Request, credentials: Credentials
    ) -> ProfileDiff:
        from orchestrator.analysis.diff import diff_profiles
        from orchestrator.analysis.diff_inputs import load_stored

        self._guard.check(request, credentials)
        before: Manifest = await self._ask(Api.manifest, a)
        after: Manifest = await self._ask(Api.manifest, b)
        before_in: StorageSpec = await self._ask(Api.profile_storage, a)
        after_in: StorageSpec = await self._ask(Api.profile_storage, b)
        sides = await asyncio.gather(
            asyncio.to_thread(load_stored, before, before_in),
            asyncio.to_thread(load_stored, after, after_in),
        )
        return await asyncio.to_thread(diff_profiles, *sides)

    @router.get("/v1/profiles/{profile_id}/links", response_model=ProfileLinks, summary="Browser URLs of artifacts")
    async def profile_links(self, profile_id: ProfileId, request: Request, credentials: Credentials) -> ProfileLinks:
        self._guard.check(request, credentials)
        manifest: Manifest = await self._ask(Api.manifest, profile_id)
        link_key = self._guard.link_key
        expires = int(time.time()) + LINK_TTL_S if link_key is not None else None
        base = f"{request.scope.get('root_path', '')}/v1/profiles/{quote(profile_id, safe='')}/artifacts/"

        def url(key: str) -> str:
            plain = base + quote(key)
            if link_key is None or expires is None:
                return plain
            return f"{plain}?expires={expires}&signature={sign(link_key, profile_id, key, expires)}"

        links = [
            ArtifactLink(kind=art.kind, key=art.key, rank=rank, bytes=art.bytes, url=url(art.key))
            for rank, art in [(r.rank, x) for r in manifest.ranks for x in r.artifacts]
            + [(None, x) for x in manifest.artifacts]
        ]
        report = next((link.url for link in links if link.kind == "report"), None)
        return ProfileLinks(expires_at=expires, report=report, artifacts=links)

    @router.get("/v1/profiles/{profile_id}/artifacts/{key:path}", summary="One artifact, checked against its sha256")
    async def get_artifact(
        self,
        profile_id: ProfileId,
        key: str,
        request: Request,
        credentials: Credentials,
        expires: Annotated[int | None, Query(description="Expiry of a signed URL (from /links).")] = None,
        signature: Annotated[str | None, Query(max_length=64)] = None,
    ) -> Response:
        if not self._signed_ok(profile_id, key, expires, signature):
            self._guard.check(request, credentials)
        manifest: Manifest = await self._ask(Api.manifest, profile_id)
        artifact, _ = _find(manifest, key)
        data = await self._manifest_bytes(manifest, artifact)
        if artifact.kind == "report":
            return Response(
                data, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": FRAMED_REPORT_CSP}
            )
        name = key.rsplit("/", 1)[-1]
        headers = {"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff"}
        return Response(data, media_type="application/octet-stream", headers=headers)

    @router.get("/v1/profiles/{profile_id}/memory/{rank}", summary="A rank's memory timeline, downsampled")
    async def memory_timeline(
        self, profile_id: ProfileId, rank: int, request: Request, credentials: Credentials
    ) -> dict[str, Any]:
        self._guard.check(request, credentials)
        manifest: Manifest = await self._ask(Api.manifest, profile_id)
        found = [a for r in manifest.ranks if r.rank == rank for a in r.artifacts if a.kind == "memory_timeline"]
        if not found:
            raise NotFoundError(
                f"rank {rank} of profile {profile_id} recorded no memory timeline (profile with profile_memory)",
                profile_id=profile_id,
            )
        try:
            timeline = parse_timeline(await self._manifest_bytes(manifest, found[0]))
        except ValueError as e:
            raise IntegrityError(f"rank {rank}'s memory timeline of {profile_id} is unreadable: {e}") from e
        return {"rank": rank, "devices": {name: downsample(s).model_dump() for name, s in timeline.items()}}
