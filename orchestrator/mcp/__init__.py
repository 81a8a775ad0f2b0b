"""``rayprof mcp``: a Model Context Protocol server over :class:`~orchestrator.client.ProfilingClient`.

Needs the ``mcp`` extra (``pip install 'rayprof[mcp]'``); nothing else in rayprof imports it.
"""

from orchestrator.mcp.server import build_server, lazy_client, serve_stdio

__all__ = ["build_server", "lazy_client", "serve_stdio"]
