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

Not every training loop steps a ``torch.optim`` optimizer: Keras 3 on its torch
backend (``model.fit``: its own optimizers update the weights with torch ops),
fastai's ``Learner`` (its own ``Optimizer`` class) and a hand-written update
(``p -= lr * p.grad``) call ``loss.backward()`` and never
``optimizer.step()``, so the agent never attached to them and their runs never
appeared. So, until the first optimizer step, the hook also counts backward
passes: it wraps ``torch.autograd.backward``, which ``Tensor.backward`` looks up
at each call. After ``BACKWARDS_WITHOUT_OPTIMIZER`` backward passes with no
optimizer step it hands over to the agent, which then counts one step per
backward pass (:func:`count_backward_passes`) until an optimizer step shows up
(gradient accumulation over more micro-batches than that: the optimizer hook
then takes over, as it does at a first step). A loop that steps an optimizer
pays for the wrapper only until its first step, when the original comes back.

It knows nothing of the agent: :func:`install` is given what to call at the
first step (``actors.agent.install`` hands it the runtime's attach), so the
runtime may import this module without an import circle.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["BACKWARDS_WITHOUT_OPTIMIZER", "FirstStep", "NoOptimizer", "count_backward_passes", "discard", "install"]

logger = logging.getLogger(__name__)

OPTIMIZER_MODULE = "torch.optim.optimizer"
AUTOGRAD_MODULE = "torch.autograd"
# Backward passes with no optimizer step after which the loop is taken to step none. Above the gradient
# accumulation most loops use (1 to 8 micro-batches; beyond it the optimizer hook takes over at the first
# step, the count going on), and few enough that a loop without one is seen within its first minute.
BACKWARDS_WITHOUT_OPTIMIZER = 16

FirstStep = Callable[[Any, Any, Any, Any], None]
"""Called at the first optimizer step with the hook's handle (to remove it), the optimizer, args, kwargs."""
NoOptimizer = Callable[[], None]
"""Called once, at the ``BACKWARDS_WITHOUT_OPTIMIZER``-th backward pass when no optimizer has stepped."""

_lock = threading.Lock()
_handle: Any = None
_finder: _AfterImport | None = None
_then: FirstStep | None = None
_then_backward: NoOptimizer | None = None
_backwards: _BackwardWatch | None = None


def _nothing() -> None:
    pass


class _BackwardWatch:
    """Wraps ``torch.autograd.backward`` to call ``on_backward`` after each backward pass that returns.

    ``Tensor.backward`` calls ``torch.autograd.backward`` by that name at each call, so replacing the module's
    attribute sees every ``loss.backward()``; :meth:`remove` puts the original back (where nobody replaced
    ours since). A backward inside another is part of it: reentrant activation checkpointing
    (``checkpoint(..., use_reentrant=True)``) calls ``torch.autograd.backward`` once per segment inside the
    loop's own, on the engine's threads, while the loop's is still open.
    """

    def __init__(self, autograd: ModuleType, on_backward: Callable[[], None]) -> None:
        self._autograd = autograd
        self._original = original = autograd.backward
        self.on_backward = on_backward
        self.calls = 0
        self._open = 0
        watch = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            watch._open += 1
            try:
                result = original(*args, **kwargs)
            finally:
                watch._open -= 1
            if watch._open == 0:
                watch.calls += 1
                watch.on_backward()
            return result

        self._wrapper = backward
        autograd.backward = backward

    def remove(self) -> None:
        self.on_backward = _nothing
        if self._autograd.backward is self._wrapper:
            self._autograd.backward = self._original


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


def install(then: FirstStep, then_backward: NoOptimizer) -> None:
    """Call ``then`` at this process's first optimizer step, or ``then_backward`` when its backward passes come
    with no optimizer step (``actors.agent.install`` is the setup hook).

    Imports nothing beyond the standard library here: torch is imported by the
    training code, and the hook is registered when it is. Never raises: Ray kills
    a worker whose setup hook fails.
    """
    global _finder, _then, _then_backward
    try:
        with _lock:
            _then, _then_backward = then, then_backward
            module = sys.modules.get(OPTIMIZER_MODULE)
            if module is not None and hasattr(module, "register_optimizer_step_post_hook"):
                _register(module)
            elif _finder is None:
                _finder = _AfterImport(OPTIMIZER_MODULE, _register)
                sys.meta_path.insert(0, _finder)
    except Exception:
        logger.exception("rayprof: install() failed; this worker runs without an agent")


def discard() -> None:
    """The agent attached explicitly, or this is no Ray Train worker: the first-step hook, the backward watch and
    the import watch are not needed."""
    global _handle, _finder
    with _lock:
        handle, _handle = _handle, None
        if _finder is not None:
            _finder.remove()
            _finder = None
    if handle is not None:
        handle.remove()
    _unwatch_backward()


def count_backward_passes(on_step: Callable[[], None]) -> None:
    """Call ``on_step`` after every backward pass from now on, until an optimizer step or :func:`discard` (called by
    the watch itself, in the training thread, so it is still there)."""
    watch = _backwards
    if watch is not None:
        watch.on_backward = on_step


def _register(module: ModuleType) -> None:
    """Register the first-step hook and the backward watch once; runs inside torch's own import (which has
    imported ``torch.autograd`` by then), so it imports nothing."""
    global _handle, _backwards
    try:
        if _handle is None:
            _handle = module.register_optimizer_step_post_hook(_first_step)
        autograd = sys.modules.get(AUTOGRAD_MODULE)
        if _backwards is None and _then_backward is not None and autograd is not None:
            _backwards = _BackwardWatch(autograd, _count_backward)
    except Exception:
        logger.exception("rayprof: registering the optimizer hook failed; this worker runs without an agent")


def _unwatch_backward() -> None:
    global _backwards
    watch, _backwards = _backwards, None
    if watch is not None:
        watch.remove()


def _count_backward() -> None:
    """After a backward pass, before any optimizer step: at the ``BACKWARDS_WITHOUT_OPTIMIZER``-th, hand over once.
    Runs inside the training code's ``backward()``: never raises."""
    watch = _backwards
    if watch is None or watch.calls < BACKWARDS_WITHOUT_OPTIMIZER:
        return
    watch.on_backward = _nothing
    try:
        if _then_backward is None:
            raise RuntimeError("the backward watch fired without install()")
        _then_backward()
    except Exception:
        logger.exception("rayprof: attaching the agent failed; this worker runs without one")
        discard()


def _first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The first optimizer step of this process: hand over to what :func:`install` was given. Steps are counted
    by optimizer steps from here on: the backward watch goes."""
    global _handle
    _unwatch_backward()
    handle, _handle = _handle, None
    try:
        if _then is None:
            raise RuntimeError("the first-step hook fired without install()")
        _then(handle, optimizer, args, kwargs)
    except Exception:
        logger.exception("rayprof: attaching the agent failed; this worker runs without one")
        if handle is not None:
            handle.remove()
