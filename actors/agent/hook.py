"""The ``worker_process_setup_hook``: arm the lazy attach without importing torch.

Ray runs the setup hook when a worker process starts, before it gives the
process its task or actor and so before it sets ``OMP_NUM_THREADS`` to the
CPUs that task holds. torch's OpenMP runtime reads that variable once, when
torch is first imported: a hook that imported torch made every Ray Train
worker run torch with one intra-op thread per core of the node instead of the
Ray-assigned count (2 against 1 on a 2-core machine, +4 to +7% per step on a
small job; far more oversubscription on a large node). So this module imports
only the standard library, and registers the optimizer hook the moment the
worker's own code finishes importing ``torch.optim.optimizer``.

It knows nothing of the agent: :func:`install` is given what to call at the
first step (``actors.agent.install`` hands it the runtime's attach), so the
runtime may import this module without an import circle.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["FirstStep", "discard", "install"]

logger = logging.getLogger(__name__)

OPTIMIZER_MODULE = "torch.optim.optimizer"

FirstStep = Callable[[Any, Any, Any, Any], None]
"""Called at the first optimizer step with the hook's handle (to remove it), the optimizer, args, kwargs."""

_lock = threading.Lock()
_handle: Any = None
_finder: _AfterImport | None = None
_then: FirstStep | None = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after ``name`` has been executed by its own loader.

    Python has no post-import hook; wrapping the found spec's loader is the
    standard way to get one (as ``wrapt``'s post-import hooks do). The finder
    stays first on ``sys.meta_path`` only until that one import has happened.
    """

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then, finder = spec.loader, self.then, self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                finder.remove()
                then(module)

        spec.loader = _Loader()
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def install(then: FirstStep) -> None:
    """Call ``then`` at this process's first optimizer step (``actors.agent.install`` is the setup hook).

    Imports nothing beyond the standard library here: torch is imported by the
    training code, and the hook is registered when it is. Never raises: Ray kills
    a worker whose setup hook fails.
    """
    global _finder, _then
    try:
        with _lock:
            _then = then
            module = sys.modules.get(OPTIMIZER_MODULE)
            if module is not None and hasattr(module, "register_optimizer_step_post_hook"):
                _register(module)
            elif _finder is None:
                _finder = _AfterImport(OPTIMIZER_MODULE, _register)
                sys.meta_path.insert(0, _finder)
    except Exception:
        logger.exception("rayprof: install() failed; this worker runs without an agent")


def discard() -> None:
    """The agent attached explicitly: the first-step hook and the import watch are not needed."""
    global _handle, _finder
    with _lock:
        handle, _handle = _handle, None
        if _finder is not None:
            _finder.remove()
            _finder = None
    if handle is not None:
        handle.remove()


def _register(module: ModuleType) -> None:
    """Register the first-step hook once; runs inside torch's own import, so it imports nothing."""
    global _handle
    try:
        if _handle is None:
            _handle = module.register_optimizer_step_post_hook(_first_step)
    except Exception:
        logger.exception("rayprof: registering the optimizer hook failed; this worker runs without an agent")


def _first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The first optimizer step of this process: hand over to what :func:`install` was given."""
    global _handle
    handle, _handle = _handle, None
    try:
        if _then is None:
            raise RuntimeError("the first-step hook fired without install()")
        _then(handle, optimizer, args, kwargs)
    except Exception:
        logger.exception("rayprof: attaching the agent failed; this worker runs without one")
        if handle is not None:
            handle.remove()
