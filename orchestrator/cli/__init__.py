"""The ``rayprof`` command line: client side of the HTTP service or the control actor."""

from orchestrator.cli.main import main

__all__ = ["main"]
