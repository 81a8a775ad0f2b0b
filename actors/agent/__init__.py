"""The agent: the part of rayprof that runs inside every Ray Train worker process.

``install`` (a ``worker_process_setup_hook``), ``attach`` and ``step`` are the
public surface. This package imports no analysis, service or CLI code: a
training worker pays only for what it runs. Importing it imports no torch
either (``install`` runs before Ray has set the worker's ``OMP_NUM_THREADS``,
see :mod:`actors.agent.hook`): ``Agent``, ``attach`` and ``step`` load the
runtime on first use.
"""

from __future__ import annotations

from typing import Any

from actors.agent import hook

__all__ = ["Agent", "attach", "install", "step"]

_RUNTIME_NAMES = ("Agent", "attach", "step")


def install() -> None:
    """``worker_process_setup_hook``: attach lazily at the first optimizer step of a Train worker (or, in a loop
    that steps no ``torch.optim`` optimizer, after its first backward passes: :mod:`actors.agent.hook`).

    Use with ``runtime_env={"worker_process_setup_hook": "actors.agent.install"}``.
    In processes that are not Ray Train workers the hook removes itself at their
    first optimizer step (most never take one).
    """
    hook.install(_adopt, _adopt_backward)


def _adopt(handle: Any, optimizer: Any, args: Any, kwargs: Any) -> None:
    """The first optimizer step: load the runtime (which imports torch's profiler) and let it attach.
    Here, not in the hook, so that the hook imports nothing of the runtime that imports it."""
    from actors.agent import runtime

    runtime.adopt_lazy_hook(handle, optimizer, args, kwargs)


def _adopt_backward() -> None:
    """Backward passes and no optimizer step: the same, the agent counting backward passes."""
    from actors.agent import runtime

    runtime.adopt_backward_passes()


def __getattr__(name: str) -> Any:
    if name not in _RUNTIME_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from actors.agent import runtime

    # Bound once: later look-ups (``actors.agent.step()`` in a training loop) find it directly.
    for each in _RUNTIME_NAMES:
        globals()[each] = getattr(runtime, each)
    return globals()[name]
