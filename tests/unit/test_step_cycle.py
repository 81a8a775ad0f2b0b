"""What one step is: the agent's optimizer hook learns the job's cycle of optimizer steps (real torch, no Ray)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from actors.agent import runtime
from actors.agent.runtime import Agent
from actors.agent.step_cycle import EXPLICIT_STEP, LEARN_MAX_CALLS, StepCycle, period
from orchestrator.models.agent_protocol import WorkerInfo

INFO = WorkerInfo(
    agent_id="a1", target="unit", world_rank=0, world_size=1, local_rank=0, node_rank=0,
    node_id="n", host="h", pid=1, device="cpu", torch_version=torch.__version__,
)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


@pytest.fixture
def cycle() -> Iterator[tuple[StepCycle, Counter]]:
    counter = Counter()
    c = StepCycle(counter)
    try:
        yield c, counter
    finally:
        c.remove()


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _backward(model: torch.nn.Module) -> torch.Tensor:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    return loss


def _gan_iterations(g_opt: torch.optim.Optimizer, d_opt: torch.optim.Optimizer, g, d, n: int, critic: int = 1) -> None:
    for _ in range(n):
        for _ in range(critic):
            d_opt.zero_grad()
            _backward(d)
            d_opt.step()
        g_opt.zero_grad()
        _backward(g)
        g_opt.step()


def test_one_optimizer_counts_every_step_from_the_first(cycle):
    c, steps = cycle
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counts = []
    for _ in range(20):
        _backward(model)
        opt.step()
        counts.append(steps.n)
    assert counts == list(range(1, 21))
    assert c.learned and c.definition == "1 step = SGD.step ×1; 1 forward pass (Sequential)"


def test_a_gan_step_is_one_generator_and_one_discriminator_step(cycle):
    c, steps = cycle
    g, d = _model(0), _model(1)
    g_opt, d_opt = torch.optim.Adam(g.parameters()), torch.optim.SGD(d.parameters(), lr=0.01)
    _gan_iterations(g_opt, d_opt, g, d, 10)
    assert c.learned and c.definition == "1 step = SGD.step ×1 + Adam.step ×1; 2 forward passes (Sequential)"
    assert steps.n == 10
    before = steps.n
    _gan_iterations(g_opt, d_opt, g, d, 7)
    assert steps.n - before == 7


def test_a_critic_stepped_five_times_per_generator_step_makes_one_step_of_six(cycle):
    c, steps = cycle
    g, d = _model(0), _model(1)
    g_opt, d_opt = torch.optim.Adam(g.parameters()), torch.optim.RMSprop(d.parameters())
    _gan_iterations(g_opt, d_opt, g, d, 4, critic=5)
    assert c.learned and c.definition == "1 step = RMSprop.step ×5 + Adam.step ×1; 6 forward passes (Sequential)"
    before = steps.n
    for i in range(1, 6):
        _gan_iterations(g_opt, d_opt, g, d, 1, critic=5)
        assert steps.n - before == i


def test_after_learning_the_hook_is_swapped_for_the_counting_one(cycle):
    c, steps = cycle
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook_id = c._handle.id
    assert _global_optimizer_post_hooks[hook_id] == c._learn
    for _ in range(10):
        _backward(model)
        opt.step()
    counting = _global_optimizer_post_hooks[hook_id]
    assert counting != c._learn

    # The idle path: the counting hook calls nothing but id() and the step counter.
    calls: list[str] = []

    def tracer(frame, event, arg):
        if event in ("call", "c_call"):
            calls.append(f"{event}:{getattr(arg, '__name__', frame.f_code.co_name)}")

    sys.setprofile(tracer)
    counting(opt, (), {})
    sys.setprofile(None)
    assert calls == ["call:count_one", "c_call:id", "call:__call__", "c_call:setprofile"]


def test_an_optimizer_stepping_others_inside_its_step_is_one_step_and_says_what_runs_inside(cycle):
    # As TorchRec's CombinedOptimizer: the held optimizers' post-step hooks run before the wrapper's.
    class Combined(torch.optim.Optimizer):
        def __init__(self, optimizers):
            self.optimizers = optimizers
            super().__init__([p for o in optimizers for g in o.param_groups for p in g["params"]], {})

        def step(self, closure=None):
            for o in self.optimizers:
                o.step()

    c, steps = cycle
    g, d = _model(0), _model(1)
    opt = Combined([torch.optim.Adam(g.parameters()), torch.optim.SGD(d.parameters(), lr=0.01)])
    for _ in range(12):
        _backward(g)
        _backward(d)
        opt.step()
    assert steps.n == 12
    assert c.definition == "1 step = Combined.step ×1 (inside: Adam.step ×1 + SGD.step ×1); 2 forward passes (Sequential)"
    # The depth is kept while learning only: counting pays nothing for it.
    assert c._pre is None and all(getattr(h, "__self__", None) is not c for h in _global_optimizer_pre_hooks.values())


def test_a_closure_optimizer_step_is_one_step_however_often_it_evaluates(cycle):
    c, steps = cycle
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x = torch.randn(4, 8)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(12):
        opt.step(closure)
    assert steps.n == 12 and c.definition == "1 step = LBFGS.step ×1; 1 forward pass (Sequential)"


def test_gradient_accumulation_is_one_step_per_optimizer_step(cycle):
    c, steps = cycle
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        for _ in range(4):
            _backward(model)
        opt.step()
        opt.zero_grad()
    assert steps.n == 10 and c.definition == "1 step = AdamW.step ×1; 4 forward passes (Sequential)"


def test_a_step_amp_skips_on_inf_gradients_is_still_a_step(cycle):
    c, steps = cycle
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    skipped = 0
    for i in range(12):
        opt.zero_grad()
        scaler.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
        if i in (0, 5, 9):
            next(model.parameters()).grad.fill_(float("inf"))  # GradScaler skips optimizer.step() on this one
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < scale
    assert skipped == 3
    assert steps.n == 12


def test_a_compiled_model_keeps_one_step_per_optimizer_step(cycle):
    c, steps = cycle
    model = _model()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.Adam(model.parameters())
    for _ in range(10):
        opt.zero_grad()
        compiled(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    assert steps.n == 10 and c.definition == "1 step = Adam.step ×1; 1 forward pass (Sequential)"


def test_an_optimizer_rebuilt_every_iteration_over_the_same_parameters_keeps_counting(cycle):
    c, steps = cycle
    model = _model()
    for _ in range(20):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        _backward(model)
        opt.step()
    assert steps.n == 20 and c.definition == "1 step = SGD.step ×1; 1 forward pass (Sequential)"


def test_a_new_optimizer_after_learning_starts_learning_again_and_never_goes_back(cycle):
    c, steps = cycle
    model, head = _model(0), _model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        _backward(model)
        opt.step()
    assert steps.n == 10
    # Fine-tuning phase: a second optimizer joins, stepped after the first.
    head_opt = torch.optim.Adam(head.parameters())
    counts = []
    for _ in range(10):
        _backward(model)
        opt.step()
        _backward(head)
        head_opt.step()
        counts.append(steps.n)
    assert counts == sorted(counts) and counts[-1] > 10
    assert c.definition == "1 step = Adam.step ×1 + SGD.step ×1; 2 forward passes (Sequential)"
    before = steps.n
    for _ in range(3):
        opt.step()
        head_opt.step()
    assert steps.n - before == 3


def test_no_repeating_cycle_counts_the_first_optimizer_and_says_so(cycle):
    c, steps = cycle
    models = [_model(i) for i in range(3)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    # An irregular pattern: the first optimizer, then a growing run of the others.
    order = [0]
    k = 1
    while len(order) < LEARN_MAX_CALLS + 5:
        order += [1 + (j % 2) for j in range(k)] + [0]
        k += 1
    for i in order[: LEARN_MAX_CALLS + 5]:
        opts[i].step()
    assert c.learned and c.definition is not None and "no repeating cycle" in c.definition
    assert steps.n == order[: LEARN_MAX_CALLS + 5].count(0)


def test_the_agent_hook_counts_cycles_and_heartbeats_say_what_a_step_is():
    agent = Agent(INFO)  # never started: no thread, no controller
    g, d = _model(0), _model(1)
    g_opt, d_opt = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    runtime._set_hook(agent)
    try:
        _gan_iterations(g_opt, d_opt, g, d, 12)
    finally:
        runtime._remove_hook()
    assert agent.step_count == 12
    assert agent._heartbeat().step_definition == "1 step = Adam.step ×2; 2 forward passes (Sequential)"


def test_explicit_steps_say_so_in_the_heartbeat(monkeypatch):
    agent = Agent(INFO)
    monkeypatch.setattr(runtime, "_agent", agent)
    runtime._set_hook(agent)
    opt = torch.optim.SGD(_model().parameters(), lr=0.01)
    opt.step()
    runtime.step()  # the first explicit step removes the optimizer hook
    opt.step()
    runtime.step()
    assert runtime._hook_handle is None
    assert agent.step_count == 3
    assert agent._heartbeat().step_definition == EXPLICIT_STEP



class _Opt:
    """Stands in for an optimizer: the cycle reads only its class name and its first parameter."""

    def __init__(self) -> None:
        self.param_groups = [{"params": [object()]}]


_KINDS = [type(name, (_Opt,), {}) for name in ("Adam", "SGD", "RMSprop")]


@given(
    cycle=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    kinds=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    after=st.integers(1, 10),
)
@settings(max_examples=150, deadline=None)
def test_any_repeating_cycle_is_learned_and_then_counted_once_per_cycle(cycle, kinds, after):
    opts = [_KINDS[k]() for k in kinds]
    calls = [opts[i] for i in cycle]
    counter = Counter()
    c = StepCycle(counter)
    try:
        hook_calls = 0
        previous = 0
        for _ in range(LEARN_MAX_CALLS // len(calls) + 1):
            for opt in calls:
                c._current()(opt, (), {})
                hook_calls += 1
                assert previous <= counter.n <= hook_calls
                previous = counter.n
        assert c.learned
        if "no repeating cycle" in (c.definition or ""):
            return
        before = counter.n
        for _ in range(after):
            for opt in calls:
                c._current()(opt, (), {})
        # The learned cycle is the smallest one that repeats (it divides the pattern's length).
        p = period(cycle * 3)
        assert counter.n - before == after * len(cycle) // p
    finally:
        c.remove()


def test_when_the_optimizer_that_ends_each_step_stops_the_others_are_counted_again(cycle):
    c, steps = cycle
    g, d = _model(0), _model(1)
    g_opt, d_opt = torch.optim.Adam(g.parameters()), torch.optim.SGD(d.parameters(), lr=0.01)
    _gan_iterations(g_opt, d_opt, g, d, 10)
    assert c.definition == "1 step = SGD.step ×1 + Adam.step ×1; 2 forward passes (Sequential)"
    # The generator is frozen: only the discriminator steps from now on.
    counts = []
    for _ in range(30):
        d_opt.step()
        counts.append(steps.n)
    assert counts == sorted(counts) and counts[-1] - counts[0] >= 20
    assert c.definition == "1 step = SGD.step ×1"


def test_a_duck_typed_optimizer_under_grad_scaler_still_steps(cycle):
    # Not a torch Optimizer (no hooks): the GradScaler wrapper must leave it alone, never break training.
    class Duck:
        def __init__(self, params: list[torch.Tensor]) -> None:
            self.param_groups = [{"params": params}]
            self.steps = 0

        def step(self) -> None:
            self.steps += 1

    model = _model()
    duck = Duck(list(model.parameters()))
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        scaler.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
        scaler.step(duck)
        scaler.update()
    assert duck.steps == 3


def test_a_failure_while_learning_never_reaches_the_training_loop(cycle, monkeypatch):
    c, steps = cycle

    def broken(seq):
        raise RuntimeError("planted")

    monkeypatch.setattr("actors.agent.step_cycle.period", broken)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        _backward(model)
        opt.step()  # raised RuntimeError inside optimizer.step() before
    assert steps.n == 12
    assert c.definition is not None and "could not be learned" in c.definition
