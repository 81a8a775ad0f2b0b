"""``rayprof mcp``: serve the Model Context Protocol on stdio over the client the other commands use."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.cli.commands import _client
from orchestrator.errors import EXIT_OK, ConfigurationError

__all__ = ["add_command"]


def add_command(command: Callable[..., Any], parents: Sequence[Any], version: str) -> None:
    p = command(
        "mcp",
        lambda args: mcp(args, version),
        "serve the Model Context Protocol on stdio for coding agents (needs rayprof[mcp])",
        parents,
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="leave out the tools that act on the job (profile, take_stacks, create_watch, delete_watch)",
    )


def mcp(args: argparse.Namespace, version: str) -> int:
    try:
        from orchestrator.mcp import lazy_client, serve_stdio
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "mcp":
            raise
        raise ConfigurationError("rayprof mcp needs the mcp package: pip install 'rayprof[mcp]'") from None
    # Over HTTP the client is made now, asking nothing of the service, so a token or URL configured wrongly fails
    # at start (exit 2), not at an agent's first call; in the cluster it connects on the first tool call, so the
    # agent's client starts the server before any cluster is asked.
    made = None if args.in_cluster else _client(args)
    serve_stdio(lazy_client(lambda: made if made is not None else _client(args)), read_only=args.read_only, version=version)
    return EXIT_OK
