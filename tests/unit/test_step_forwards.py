"""What one step is also counts the model's forward passes, while the cycle is learned (real torch, no Ray)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from torch.nn.modules import module as torch_module

from actors.agent import runtime
from actors.agent.forward_count import ForwardCount
from actors.agent.runtime import Agent
from actors.agent.step_cycle import LEARN_MAX_CALLS, StepCycle
from tests.unit.test_step_cycle import INFO, Counter


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Generator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Discriminator(Net):
    pass


def _hooks() -> list[object]:
    """What torch's global module forward hook dicts hold."""
    return [
        *torch_module._global_forward_pre_hooks.values(),
        *torch_module._global_forward_hooks.values(),
        *torch_module._global_forward_hooks_always_called,
    ]


@pytest.fixture
def cycle() -> Iterator[tuple[StepCycle, Counter]]:
    assert _hooks() == []
    counter = Counter()
    c = StepCycle(counter)
    try:
        yield c, counter
    finally:
        c.remove()
    assert _hooks() == []


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, forwards: int = 1) -> None:
    opt.zero_grad()
    for _ in range(forwards):
        model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()


def test_a_gan_step_says_the_discriminator_ran_three_times_and_the_generator_once(cycle):
    c, _ = cycle
    g, d = Generator(), Discriminator()
    g_opt, d_opt = torch.optim.Adam(g.parameters()), torch.optim.SGD(d.parameters(), lr=0.01)
    for _ in range(6):
        fake = g(torch.randn(4, 8))
        d_opt.zero_grad()
        (d(torch.randn(4, 8)).mean() - d(fake.detach()).mean()).backward()  # real and fake batches
        d_opt.step()
        g_opt.zero_grad()
        d(fake).mean().backward()
        g_opt.step()
    assert c.definition == "1 step = SGD.step ×1 + Adam.step ×1; 4 forward passes (Discriminator ×3, Generator ×1)"


def test_gradient_accumulation_says_four_forward_passes_per_optimizer_step(cycle):
    c, _ = cycle
    model = Net()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        _step(model, opt, forwards=4)
    assert c.definition == "1 step = AdamW.step ×1; 4 forward passes (Net)"


def test_a_loss_module_is_not_a_forward_pass(cycle):
    c, _ = cycle
    model, loss = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        opt.zero_grad()
        loss(model(torch.randn(4, 8)), torch.zeros(4, 1)).backward()
        opt.step()
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_a_batchs_preprocessor_called_before_the_model_is_not_a_forward_pass(cycle):
    # MMEngine's train_step calls the model's data_preprocessor (a module: BaseDataPreprocessor, mmdet's
    # DetDataPreprocessor) on each batch, then the model.
    class ImgDataPreprocessor(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - 0.5) / 0.25

    c, _ = cycle
    model, preprocess = Net(), ImgDataPreprocessor()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        opt.zero_grad()
        model(preprocess(torch.randn(4, 8))).sum().backward()
        opt.step()
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_nested_modules_count_once_as_the_outermost(cycle):
    c, _ = cycle
    model = Net()  # Net > Sequential > Linear, ReLU, Linear
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        _step(model, opt)
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_the_module_hooks_are_in_while_learning_and_gone_once_the_cycle_is_learned(cycle):
    c, _ = cycle
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    assert len(_hooks()) == 3  # pre-hook, hook, its always_call mark
    for _ in range(10):
        _step(model, opt)
    assert c.learned and _hooks() == []


def test_a_closure_optimizers_forwards_inside_its_step_are_that_steps(cycle):
    c, _ = cycle
    model = Net()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    calls = [0]

    def closure() -> torch.Tensor:
        calls[0] += 1
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()  # a new batch each evaluation: no early convergence
        loss.backward()
        return loss

    for _ in range(12):
        opt.step(closure)
    assert calls[0] == 12 * 3
    assert c.definition == "1 step = LBFGS.step ×1; 3 forward passes (Net)"


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_blocks_forward_run_again_by_backward_is_no_forward_pass(reentrant: bool) -> None:
    # torch.utils.checkpoint recomputes the block in backward, on a CPU on the training thread: before, a Trainer
    # with gradient_checkpointing read "9 forward passes (GPT2LMHeadModel ×1, LayerNorm ×4, GPT2Attention ×2, ...)".
    net, block = Net(), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    count = ForwardCount()
    count.start()
    try:
        x = torch.randn(4, 8, requires_grad=True)
        y = net(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant))
        y.sum().backward()
    finally:
        count.stop()
    assert count.take() == {"Sequential": 1, "Net": 1}


def test_no_forward_seen_says_nothing_of_forward_passes(cycle):
    c, _ = cycle
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        opt.zero_grad()
        model.forward(torch.randn(4, 8)).pow(2).mean().backward()  # bypasses Module.__call__ and its hooks
        opt.step()
    assert c.definition == "1 step = SGD.step ×1"


def test_another_threads_module_calls_are_not_the_training_loops(cycle):
    c, _ = cycle
    model, other = Net(), Generator()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        side = threading.Thread(target=other, args=(torch.randn(4, 8),))
        side.start()
        side.join(timeout=30)
        _step(model, opt)
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_amp_skipped_steps_keep_one_forward_pass_per_step(cycle):
    c, steps = cycle
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i in range(12):
        opt.zero_grad()
        scaler.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
        if i in (2, 5):
            next(model.parameters()).grad.fill_(float("inf"))  # GradScaler skips optimizer.step() on this one
        scaler.step(opt)
        scaler.update()
    assert steps.n == 12 and c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_relearning_counts_the_new_cycles_forward_passes_and_removes_the_hooks_again(cycle):
    c, _ = cycle
    model, head = Net(), Generator()
    opt, head_opt = torch.optim.SGD(model.parameters(), lr=0.01), torch.optim.Adam(head.parameters())
    for _ in range(10):
        _step(model, opt)
    assert _hooks() == []
    _step(model, opt)
    _step(head, head_opt)  # a new optimizer: learning again, the module hooks back in
    assert len(_hooks()) == 3
    for _ in range(10):
        _step(model, opt, forwards=2)
        _step(head, head_opt)
    # Relearned from the step that showed the new optimizer: the cycle read from there.
    assert c.definition == "1 step = Adam.step ×1 + SGD.step ×1; 3 forward passes (Net ×2, Generator ×1)"
    assert _hooks() == []


def test_no_repeating_cycle_states_the_forward_passes_between_the_first_optimizers_steps(cycle):
    c, _ = cycle
    models = [Net(), Generator(), Discriminator()]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    order = [0]
    k = 1
    while len(order) < LEARN_MAX_CALLS + 5:  # the irregular pattern of test_step_cycle's
        order += [1 + (j % 2) for j in range(k)] + [0]
        k += 1
    for i in order[: LEARN_MAX_CALLS + 5]:
        if i == 0:
            models[0](torch.randn(4, 8))
        opts[i].step()
    assert c.definition is not None and "no repeating cycle" in c.definition
    assert c.definition.endswith("; 1 forward pass (Net)") and _hooks() == []


def test_a_failure_while_learning_removes_the_module_hooks(cycle, monkeypatch):
    c, _ = cycle

    def broken(seq):
        raise RuntimeError("planted")

    monkeypatch.setattr("actors.agent.step_cycle.period", broken)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        _step(model, opt)
    assert c.definition is not None and "could not be learned" in c.definition and _hooks() == []


def test_explicit_steps_remove_the_module_hooks(monkeypatch):
    agent = Agent(INFO)
    monkeypatch.setattr(runtime, "_agent", agent)
    runtime._set_hook(agent)
    assert len(_hooks()) == 3
    runtime.step()  # the first explicit step hands counting to agent.step() calls
    assert runtime._hook_handle is None and _hooks() == []


def _compiled_steps(n: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = Net()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(n):
        _step(compiled, opt)
    return compiled, opt


@pytest.fixture
def dynamo() -> Iterator[dict[str, dict[str, int]]]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_a_model_compiled_while_the_hooks_are_in_is_not_recompiled_when_they_go(dynamo, cycle):
    c, _ = cycle
    compiled, opt = _compiled_steps(10)  # compiled at the first step, learned by the tenth
    assert c.learned and _hooks() == []
    assert dynamo["stats"]["unique_graphs"] == 1
    for _ in range(3):
        _step(compiled, opt)
    assert dynamo["stats"]["unique_graphs"] == 1 and dict(dynamo["graph_break"]) == {}
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"  # named for the model it wraps


def test_hooks_traced_by_dynamo_are_no_ops_that_break_no_graph(dynamo, cycle, monkeypatch):
    c, _ = cycle
    # Without the compile callbacks dynamo traces the hooks themselves (as a torch without them would).
    monkeypatch.setattr("actors.agent.forward_count.ForwardCount._watch_compiles", lambda self: None)
    _compiled_steps(10)
    assert dict(dynamo["graph_break"]) == {}
    assert c.definition == "1 step = SGD.step ×1; 1 forward pass (Net)"


def test_a_dynamo_reset_while_learning_does_not_lose_the_compile_callbacks(cycle, dynamo):
    # The dynamo fixture's torch._dynamo.reset() runs after the cycle started: it cleared every callback.
    compiled, opt = _compiled_steps(10)
    for _ in range(3):
        _step(compiled, opt)
    assert dynamo["stats"]["unique_graphs"] == 1


def test_a_torch_that_calls_compile_callbacks_without_arguments_is_served():
    count = ForwardCount()
    count.start()
    try:
        count._compile_starts()  # torch before CallbackArgs called its callbacks so
        assert _hooks() == []
        count._compile_ends()
        assert len(_hooks()) == 3
    finally:
        count.stop()


def test_a_model_under_fsdp2_is_named_by_its_own_class_not_fully_shards(cycle, tmp_path):
    # fully_shard swaps the module's class for a subclass named FSDPNet: the user wrote Net.
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    c, _ = cycle
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = Net()
        fully_shard(model)
        assert type(model).__name__ == "FSDPNet"
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(10):
            _step(model, opt)
    finally:
        dist.destroy_process_group()
    assert c.definition == "1 step = AdamW.step ×1; 1 forward pass (Net)"
