"""The web console: static files at ``/`` and the routes only a browser needs.

The console (``index.html``, the ``*.js`` pages, ``app.css`` beside this file) is plain
JavaScript with no build step and nothing from a CDN, under a Content-Security-
Policy that allows only this origin's scripts and styles. It calls the v1 API
with the bearer token the user typed. The routes are in :mod:`.routes`.
"""

from orchestrator.service.console.routes import (
    CONSOLE_CSP,
    LINK_TTL_S,
    ArtifactLink,
    ConsoleRoutes,
    ProfileLinks,
    router,
    sign,
)

__all__ = ["CONSOLE_CSP", "LINK_TTL_S", "ArtifactLink", "ConsoleRoutes", "ProfileLinks", "router", "sign"]
