"""The agent: the part of rayprof that runs inside every Ray Train worker process.

``install`` (a ``worker_process_setup_hook``), ``attach`` and ``step`` are the
public surface. This package imports no analysis, service or CLI code: a
training worker pays only for what it runs.
"""

from actors.agent.runtime import Agent, attach, install, step

__all__ = ["Agent", "attach", "install", "step"]
