"""What one training step is: the job's cycle of optimizer steps, learned from its first ones.

A job with one optimizer steps it once per iteration, but a GAN steps two (the
discriminator's, then the generator's) and a WGAN's critic steps five times
per generator step. Counting every ``optimizer.step()`` as a step made a GAN's
step half an iteration, with the halves mixed in every step figure. So the
agent's optimizer post-step hook first *learns* the cycle, then counts one
step per cycle.

Learning: each call records its optimizer's key and counts a step whenever the
first-seen optimizer steps (for one optimizer that is already exact). Once the
sequence of at least ``LEARN_MIN_CALLS`` calls repeats one cycle of ``p`` calls
at least ``REPEATS`` times and ends on a cycle's end, the hook in torch's global
post-hook dict is replaced with a counting one: one ``id`` compare per call and
a step at each cycle's end. Replaced in place (same key): torch iterates that
dict while it calls the hook, and a value swap is the one change it tolerates.
The provisional count (cycle starts) goes on from where it is, so the count
never goes back; when the first optimizer steps once a cycle, as in a GAN, it
equals the cycles done at that moment and does not jump either. No cycle within ``LEARN_MAX_CALLS`` calls:
it keeps counting the first-seen optimizer's steps, and says so.

A key is an optimizer's class and its first parameter's id: the same when a
loop builds a new optimizer over the same parameters (per epoch, or per step),
different for G and D. An optimizer whose key the cycle does not hold (a new
model, a new phase of training) starts the learning again, and so do the
cycle's other optimizers stepping twice a cycle's length without its last one
(a GAN whose generator was frozen: steps would stop counting, and the run look STALLED).

Each call of ``optimizer.step()`` is one call whatever it does inside: a
closure optimizer (LBFGS, Lightning) runs forward and backward inside its one
call, gradient accumulation steps once per accumulated batch, a
``torch.compile``d model leaves the optimizer alone. GradScaler is the
exception: on inf/NaN gradients it skips ``optimizer.step()`` altogether, so
no post-step hook runs; so the agent wraps ``GradScaler._maybe_opt_step`` (its
one place that calls or skips ``optimizer.step()``) and feeds a skipped call to
the hook as the step it stands for: a step stays one iteration when AMP skips.

An optimizer that holds others (TorchRec's ``CombinedOptimizer``) steps them
inside its own step: their post-step hooks run first, its own last, so the
cycle ends on it and counts right. What one step *is* names them as what runs
inside it (``1 step = Combined.step ×1 (inside: Adam.step ×1 + SGD.step ×1)``),
as a trace shows them nested: while learning, a global pre-step hook keeps
the depth of optimizer steps (removed once the cycle is learned, so counting
pays nothing for it).

What one step is also says how many forward passes it runs (``1 step = Adam.step
×1 + SGD.step ×1; 4 forward passes (Discriminator ×3, Generator ×1)``, worded as
the trace's statement is): while learning, :class:`~actors.agent.forward_count.ForwardCount`
counts the outermost module calls through torch's global module hooks, taken at
each optimizer step, so a closure optimizer's forwards (run inside its step)
belong to that step. Grouped into the learned cycles, the most common count is
stated (the first cycle, whose forwards ran before the agent attached at its first
optimizer step, is seen in part); no forward seen: nothing is said. The module
hooks go with the pre-step hook once the cycle is learned or given up (any global
module hook slows every module call of the process), and come back to relearn.

Whose loop steps the optimizers (:mod:`orchestrator.loops`: a transformers ``Trainer``, Lightning, Accelerate, or
the job's own) is read once per learning, from the stack of the first optimizer step's hook: a report's fixes then
name that framework's settings.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from actors.agent.forward_count import ForwardCount
from orchestrator.forward_passes import phrase, typical
from orchestrator.loops import Loop, loop_of_stack

__all__ = ["BACKWARD_STEP", "EXPLICIT_STEP", "LEARN_MAX_CALLS", "LEARN_MIN_CALLS", "REPEATS", "StepCycle", "describe", "period"]

logger = logging.getLogger(__name__)

LEARN_MIN_CALLS = 8
REPEATS = 3
LEARN_MAX_CALLS = 48
EXPLICIT_STEP = "1 step = 1 actors.agent.step() call"
BACKWARD_STEP = "1 step = 1 backward pass (no torch.optim optimizer steps)"

Key = tuple[str, int]
Hook = Callable[[Any, Any, Any], None]

# The registered StepCycle that a GradScaler's skipped step is fed to (one per process).
_active: StepCycle | None = None
_scaler_watched = False


def _key(optimizer: Any) -> Key:
    try:
        return (type(optimizer).__name__, id(optimizer.param_groups[0]["params"][0]))
    except (AttributeError, IndexError, KeyError, TypeError):
        return (type(optimizer).__name__, id(optimizer))


def period(seq: list[Key]) -> int:
    """The smallest ``p`` such that ``seq`` repeats itself every ``p`` calls."""
    n = len(seq)
    for p in range(1, n + 1):
        if all(seq[i] == seq[i - p] for i in range(p, n)):
            return p
    return n


def _counted(keys: list[Key]) -> str:
    counts: dict[str, int] = {}
    for name, _ in keys:
        counts[name] = counts.get(name, 0) + 1
    return " + ".join(f"{name}.step ×{n}" for name, n in counts.items())


def describe(cycle: list[Key], nested: frozenset[Key] = frozenset()) -> str:
    """``1 step = Adam.step ×1 + SGD.step ×1``: optimizer classes in the order they step, with their counts;
    the ones ``nested`` (stepped inside another's step) follow as what runs inside."""
    outer = [k for k in cycle if k not in nested]
    inner = [k for k in cycle if k in nested]
    if not outer:  # nesting seen only partly (registered mid-step): say the order as it came
        outer, inner = cycle, []
    return "1 step = " + _counted(outer) + (f" (inside: {_counted(inner)})" if inner else "")


class StepCycle:
    """The agent's optimizer post-step hook: learns the cycle, then counts one ``on_step`` per cycle.

    ``definition`` says what one step is (read by the agent's poll thread for
    its heartbeat). Everything else runs in the training thread.
    """

    def __init__(self, on_step: Callable[[], None]) -> None:
        self._on_step = on_step
        self._seq: list[Key] = []
        self._ids: dict[Key, int] = {}
        self._cycle: list[Key] = []
        # Every optimizer the counting hook knows: the cycle's, or all seen when no cycle was found.
        self._known: set[Key] = set()
        # Calls of the cycle's last optimizer since the last step, when it steps more than once a cycle;
        # and calls of the cycle's other optimizers since the last step.
        self._seen = [0]
        self._since = [0]
        # How many calls of the others without the last one mean it stopped stepping (None: no cycle was found).
        self._patience: int | None = None
        self._handle: Any = register_optimizer_step_post_hook(self._learn)
        # While learning: how many optimizer steps are open, and the keys seen stepping inside another's.
        self._depth = 0
        self._nested: set[Key] = set()
        self._pre: Any = register_optimizer_step_pre_hook(self._enter)
        # While learning: the model's forward passes, taken at each optimizer step (one per call of _seq).
        self._forwards = ForwardCount()
        self._forwards.start()
        self._passes: list[Counter[str]] = []
        self.definition: str | None = None
        # Whose loop steps the optimizers, read from the first step's stack while learning.
        self.loop: Loop | None = None
        global _active
        _active = self
        _watch_grad_scaler()

    @property
    def learned(self) -> bool:
        return bool(self._cycle)

    def remove(self) -> None:
        """Unregister from torch (explicit steps took over, or the agent went)."""
        global _active
        self._handle.remove()
        self._stop_learning()
        if _active is self:
            _active = None

    def feed(self, optimizer: Any, args: Any = (), kwargs: Any = None) -> None:
        """One optimizer step seen before this hook was registered (the setup hook's first one)."""
        self._current()(optimizer, args, kwargs or {})

    def _current(self) -> Hook:
        hooks = self._handle.hooks_dict_ref()
        return hooks.get(self._handle.id, self._learn) if hooks is not None else self._learn

    def _swap(self, hook: Hook) -> None:
        hooks = self._handle.hooks_dict_ref()
        # Only while still registered: after remove() a swap would register it again.
        if hooks is not None and self._handle.id in hooks:
            hooks[self._handle.id] = hook

    def _enter(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._depth += 1

    def _stop_learning(self) -> None:
        """Out of torch's global optimizer pre-step and module hook dicts: counting pays for neither."""
        self._forwards.stop()
        if self._pre is not None:
            self._pre.remove()
            self._pre = None

    def _learn(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._learn_one(optimizer)
        except Exception:  # It runs inside the job's optimizer.step(): never break training.
            self._give_up()

    def _give_up(self) -> None:
        logger.exception("rayprof agent: learning the cycle of optimizer steps failed; every optimizer step is a step")
        step = self._on_step
        self._stop_learning()
        self._swap(lambda optimizer, args, kwargs: step())
        self.definition = "1 step = 1 optimizer.step() of any optimizer (the cycle could not be learned)"

    def _learn_one(self, optimizer: Any) -> None:
        key = _key(optimizer)
        # A step fed without its pre-step hook (GradScaler's skip, the setup hook's first) opened no depth.
        if self._depth > 1:
            self._nested.add(key)
        self._depth = max(0, self._depth - 1)
        seq = self._seq
        seq.append(key)
        self._passes.append(self._forwards.take())
        self._ids[key] = id(optimizer)
        if key == seq[0]:
            self._on_step()
        n = len(seq)
        if n == 1:
            self.loop = loop_of_stack(sys._getframe(1))
            self.definition = f"{describe(seq)} (learning the cycle of optimizer steps)"
        if n < LEARN_MIN_CALLS:
            return
        p = period(seq)
        if n % p == 0 and n >= REPEATS * p:
            self._settle(seq[:p], self._forward_passes([(i + 1) % p == 0 for i in range(n)]))
        elif n >= LEARN_MAX_CALLS:
            # The first-seen optimizer's steps are counted as steps: each one ends a step.
            forwards = self._forward_passes([k == seq[0] for k in seq])
            self._settle(seq[:1], forwards, known=set(seq))
            self.definition = f"{describe(seq[:1])} (no repeating cycle in the first {n} optimizer steps){forwards}"
        else:
            return
        logger.info("rayprof agent: %s", self.definition)

    def _forward_passes(self, ends: list[bool]) -> str:
        """``; 4 forward passes (Discriminator ×3, Generator ×1)``: the typical count per step, the calls of
        ``_seq`` grouped into steps where ``ends`` (calls after the last step's end are left out); nothing
        when no step showed a forward: one may run outside ``Module.__call__``, so none is not claimed."""
        steps: list[Counter[str]] = []
        current: Counter[str] = Counter()
        for seen, end in zip(self._passes, ends, strict=True):
            current.update(seen)
            if end:
                steps.append(current)
                current = Counter()
        by_module = typical(steps) if steps else Counter()
        return f"; {phrase(by_module)}" if by_module else ""

    def _settle(self, cycle: list[Key], forwards: str, known: set[Key] | None = None) -> None:
        self._cycle = cycle
        self._known = known or set(cycle)
        self._patience = None if known else 2 * len(cycle)
        self._seq = []
        self._passes = []
        self._seen[0] = self._since[0] = 0
        self._stop_learning()
        self.definition = describe(cycle, frozenset(self._nested)) + forwards
        self._swap(self._counting())

    def _counting(self) -> Hook:
        """The hook once the cycle is known: one id compare, a step when the cycle's last optimizer ends it."""
        cycle = self._cycle
        last = cycle[-1]
        times = cycle.count(last)
        last_id = self._ids[last]
        others = frozenset(self._ids[k] for k in self._known if k != last)
        step, unseen, relearn, seen, since = self._on_step, self._unseen, self._relearn, self._seen, self._since
        patience = self._patience if self._patience is not None else float("inf")
        if not others:  # one optimizer, the common case: nothing else to watch

            def count_one(optimizer: Any, args: Any, kwargs: Any) -> None:
                if id(optimizer) == last_id:
                    step()
                else:
                    unseen(optimizer, args, kwargs)

            return count_one

        if times == 1:

            def count(optimizer: Any, args: Any, kwargs: Any) -> None:
                i = id(optimizer)
                if i == last_id:
                    since[0] = 0
                    step()
                elif i in others:
                    since[0] += 1
                    if since[0] > patience:
                        relearn(optimizer, args, kwargs, "the optimizer that ended each step stopped stepping")
                else:
                    unseen(optimizer, args, kwargs)

            return count

        def count_nth(optimizer: Any, args: Any, kwargs: Any) -> None:
            i = id(optimizer)
            if i == last_id:
                seen[0] += 1
                if seen[0] == times:
                    seen[0] = since[0] = 0
                    step()
            elif i in others:
                since[0] += 1
                if since[0] > patience:
                    relearn(optimizer, args, kwargs, "the optimizer that ended each step stopped stepping")
            else:
                unseen(optimizer, args, kwargs)

        return count_nth

    def _unseen(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer object the counting hook does not know: a rebuilt one of the cycle, or a new cycle."""
        try:
            self._unseen_one(optimizer, args, kwargs)
        except Exception:  # inside the job's optimizer.step(), as _learn
            self._give_up()

    def _unseen_one(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        key = _key(optimizer)
        if key in self._known:
            self._ids[key] = id(optimizer)
            hook = self._counting()
            self._swap(hook)
            hook(optimizer, args, kwargs)
            return
        self._relearn(optimizer, args, kwargs, f"a new optimizer ({key[0]}) steps")

    def _relearn(self, optimizer: Any, args: Any, kwargs: Any, why: str) -> None:
        logger.info("rayprof agent: %s; learning the cycle of optimizer steps again", why)
        self._cycle = []
        self._known = set()
        self._ids = {}
        # Inside the post-step hook of the step that showed the change: that step is still open.
        self._depth, self._nested = 1, set()
        if self._pre is None:
            self._pre = register_optimizer_step_pre_hook(self._enter)
        # The forwards of the step that showed the change ran before this start: its cycle is seen in part.
        self._forwards.start()
        self._swap(self._learn)
        self._learn(optimizer, args, kwargs)


def _watch_grad_scaler() -> None:
    """Wrap ``GradScaler._maybe_opt_step`` once per process: a step it skips is fed to the active cycle.

    A per-call hook on that one optimizer tells whether it stepped (one hook
    registration and removal per ``scaler.step()``, next to the device sync
    GradScaler already does there); the optimizer post-step path of every other job is untouched.
    """
    global _scaler_watched
    if _scaler_watched:
        return
    _scaler_watched = True
    try:
        from torch.amp.grad_scaler import GradScaler

        original = GradScaler._maybe_opt_step
    except (ImportError, AttributeError):
        return

    def _maybe_opt_step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(optimizer, "register_step_post_hook"):  # duck-typed, no torch hooks: not ours to count
            return original(self, optimizer, optimizer_state, *args, **kwargs)
        stepped: list[bool] = []
        handle = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
        try:
            retval = original(self, optimizer, optimizer_state, *args, **kwargs)
        finally:
            handle.remove()
        cycle = _active
        if not stepped and cycle is not None:
            cycle.feed(optimizer, args, kwargs)
        return retval

    GradScaler._maybe_opt_step = _maybe_opt_step  # type: ignore[method-assign]
