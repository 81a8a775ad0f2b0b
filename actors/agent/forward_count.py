"""The model's forward passes while the step cycle is learned: outermost module calls, by class.

:class:`~actors.agent.step_cycle.StepCycle` says what one step is; a GAN's step runs the generator once
and the discriminator three times, a step with gradient accumulation runs four forwards per optimizer
step. So while it learns the cycle it counts them here, through torch's global module hooks: the
pre-hook keeps the depth of module calls and counts a call at depth 0 by its class (the model's class
for torch.compile's, DDP's and DataParallel's wrappers), leaving out torch.nn's loss modules and MMEngine's
data preprocessors as the trace does (:mod:`orchestrator.forward_passes`); the post-hook (``always_call``: a
forward that raises still closes its depth) closes it. Calls from other threads (DataParallel's replicas) are not the
training loop's, nor calls while backward runs: activation checkpointing runs a checkpointed block's
forward again there (on a CPU on the training thread), which is no pass over a batch. A forward that
runs outside ``Module.__call__`` (``model.forward(x)``, a module compiled in place with
``model.compile()``, a compiled training step) is not seen: a step that shows none says nothing about
forward passes rather than claim none.

Any global module hook sends every module call of the process through ``Module._call_impl``'s slow
path, so the hooks are removed once the cycle is learned (:meth:`ForwardCount.stop`): counting steps
after learning pays nothing for them.

torch.compile: the hooks return at once when ``torch.compiler.is_compiling()`` (dynamo traces them as
no-ops: no graph break, no side effect in compiled code). That is not enough on its own: dynamo guards
a graph traced while global hooks exist on those hooks' keys (``skip_nnmodule_hook_guards`` covers a
module's own hook dicts, not the global ones), so removing them after learning recompiled every graph
traced during learning. So while dynamo compiles a frame the hooks are out of torch's dicts (dynamo's
compile start and end callbacks, registered once ``torch._dynamo`` is loaded, which the job's
``torch.compile`` does): the graphs never see them, and a compiled module's call, counted around its
compiled code as ``OptimizedModule``'s eager call, is counted as before.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from contextlib import suppress
from threading import get_ident
from typing import Any, cast

import torch
from torch.compiler import is_compiling
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from orchestrator.forward_passes import not_a_pass

__all__ = ["ForwardCount"]

# torch warns at each call of a torch.compile'd module while any global module hook is in (its hooks see the
# wrapper's call too: ours count that one and not the model's inside). Silenced while ours are in, so a job
# profiled by rayprof does not log a warning about hooks it never registered.
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"

_CALLBACK_API = (
    "start_callbacks",
    "register_start_callback",
    "register_end_callback",
    "remove_start_callback",
    "remove_end_callback",
)

# The autograd graph task this thread runs (-1: none): what torch.utils.checkpoint itself asks. A torch without it
# counts recomputed forwards as passes, as before.
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

# torch's wrappers by class name, and the attribute that holds the model: named for the model they wrap.
_WRAPPED = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module", "DataParallel": "module"}


def _name(module: Any) -> str:
    for _ in range(len(_WRAPPED)):  # wrappers nest a few deep at most (a compiled DDP model: two)
        attr = _WRAPPED.get(type(module).__name__)
        inner = getattr(module, attr, None) if attr else None
        if inner is None:
            break
        module = inner
    return _unsharded_name(type(module))


def _unsharded_name(cls: type) -> str:
    """FSDP2's fully_shard swaps a module's class for a subclass named ``FSDP<Class>`` (bases FSDPModule and the
    class): the user's class is the name they know."""
    name = cls.__name__
    if name.startswith("FSDP") and any(base.__name__ == name[4:] for base in cls.__bases__):
        return name[4:]
    return name


class ForwardCount:
    """Outermost module calls of the training thread (the one that builds it), by class, while started."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._depth = 0
        self._thread = get_ident()
        self._wanted = False
        self._hooks: tuple[Any, Any] | None = None
        # dynamo's callback handler, once this count's compile callbacks are registered with it.
        self._compiles: Any = None
        self._quiet: Any = None  # our entry in warnings.filters

    def start(self) -> None:
        """Count from now (the hooks go into torch's global dicts)."""
        self._wanted = True
        self.seen = Counter()
        self._depth = 0
        self._install()
        self._watch_compiles()
        if self._quiet is None:
            warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
            self._quiet = warnings.filters[0]

    def stop(self) -> None:
        """Stop counting: out of torch's hook dicts and dynamo's callbacks."""
        self._wanted = False
        self._uninstall()
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            with suppress(ValueError):  # the job (or pytest) reset the filters since
                cast(list[Any], warnings.filters).remove(quiet)  # a list at runtime; typeshed says Sequence
        handler, self._compiles = self._compiles, None
        if handler is not None:
            # torch._dynamo.reset() clears every callback: ours may be gone already.
            with suppress(ValueError):
                handler.remove_start_callback(self._compile_starts)
            with suppress(ValueError):
                handler.remove_end_callback(self._compile_ends)

    def take(self) -> Counter[str]:
        """The calls counted since the last take."""
        seen, self.seen = self.seen, Counter()
        return seen

    def _install(self) -> None:
        if self._hooks is None:
            self._hooks = (
                register_module_forward_pre_hook(self._enter),
                register_module_forward_hook(self._leave, always_call=True),
            )

    def _uninstall(self) -> None:
        hooks, self._hooks = self._hooks, None
        for handle in hooks or ():
            handle.remove()

    def _watch_compiles(self) -> None:
        """Register with dynamo's compile callbacks if the job has loaded dynamo (never load it here: ~1 s)."""
        handler: Any = getattr(sys.modules.get("torch._dynamo.callback"), "callback_handler", None)
        # A torch whose handler lacks any of these (a private API) keeps the hooks in while it compiles: the
        # hooks are no-ops in its graphs, each graph traced while learning recompiled once after. Never raise
        # into the job's forward.
        if not self._wanted or not all(hasattr(handler, attr) for attr in _CALLBACK_API):
            return
        # Registered already, unless torch._dynamo.reset() cleared every callback since.
        if self._compile_starts in handler.start_callbacks:
            return
        handler.register_start_callback(self._compile_starts)
        handler.register_end_callback(self._compile_ends)
        self._compiles = handler

    # Called with a CallbackArgs, or with nothing by torch releases before it.
    def _compile_starts(self, *args: Any) -> None:
        self._uninstall()

    def _compile_ends(self, *args: Any) -> None:
        if self._wanted:
            self._install()

    def _enter(self, module: Any, args: Any) -> None:
        if is_compiling() or get_ident() != self._thread:
            return
        if not self._depth and _graph_task_id() != -1:
            return  # a checkpointed block's forward, run again by backward (its inner calls come here too)
        self._depth += 1
        if self._depth == 1:
            name = _name(module)
            if not not_a_pass(name):
                self.seen[name] += 1
            # Dynamo may have been loaded (by the job's torch.compile) or reset since: a compile may come next.
            self._watch_compiles()

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        if is_compiling() or get_ident() != self._thread:
            return
        if self._depth:
            self._depth -= 1
