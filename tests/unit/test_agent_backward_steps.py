"""A loop that steps no torch.optim optimizer (Keras 3 on torch, fastai, a hand-written update) is attached by the
setup hook after its first backward passes and counts one step per backward pass (real torch, no Ray: each case
runs in a process of its own, as the hook changes torch's globals)."""

from __future__ import annotations

import json
import subprocess
import sys

from actors.agent.hook import BACKWARDS_WITHOUT_OPTIMIZER
from actors.agent.step_cycle import BACKWARD_STEP
from tests.support.common import REPO

# The setup hook as Ray runs it (before torch), then a Ray Train worker's identity without Ray: the runtime's
# worker_info faked, the poll thread never started.
_PRELUDE = """
import json
import actors.agent
actors.agent.install()
import torch
from actors.agent import hook, runtime
from orchestrator.models.agent_protocol import WorkerInfo
from torch.optim.optimizer import _global_optimizer_post_hooks as post_hooks
INFO = WorkerInfo(agent_id="a1", target="unit", world_rank=0, world_size=1, local_rank=0, node_rank=0,
                  node_id="n", host="h", pid=1, device="cpu", torch_version=torch.__version__)
IN_WORKER = {in_worker}
runtime.worker_info = lambda: INFO if IN_WORKER else None
runtime.Agent.start = lambda self: None
model = torch.nn.Linear(4, 1)
x = torch.randn(8, 4)

def backward_passes(n):
    for _ in range(n):
        model(x).sum().backward()
        with torch.no_grad():  # the update a framework with its own optimizer makes
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None

def wrapped():
    return hasattr(torch.autograd.backward, "__wrapped__")
"""


def _run(body: str, in_worker: bool = True) -> dict:
    code = _PRELUDE.format(in_worker=in_worker) + body
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_loop_without_an_optimizer_is_attached_after_its_first_backward_passes_and_counts_one_step_per_pass():
    got = _run(
        f"backward_passes({BACKWARDS_WITHOUT_OPTIMIZER - 1})\n"
        "before = runtime._agent is not None\n"
        "backward_passes(1 + 5)\n"
        "agent = runtime._agent\n"
        "print(json.dumps({'before': before, 'steps': agent.step_count, 'said': agent._heartbeat().step_definition}))"
    )
    assert got == {"before": False, "steps": 5, "said": BACKWARD_STEP}


def test_an_optimizer_step_after_the_backward_passes_hands_the_count_to_the_step_cycle_and_drops_the_wrapper():
    got = _run(
        f"backward_passes({BACKWARDS_WITHOUT_OPTIMIZER + 3})\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for _ in range(20):\n"
        "    model(x).sum().backward(); opt.step(); opt.zero_grad()\n"
        "agent = runtime._agent\n"
        "print(json.dumps({'steps': agent.step_count, 'said': agent._heartbeat().step_definition, 'wrapped': wrapped()}))"
    )
    # 4 backward passes counted (the 4th the first optimizer iteration's), then 20 optimizer steps: the count goes
    # on and never goes back.
    assert got == {"steps": 24, "said": "1 step = SGD.step ×1; 1 forward pass (Linear)", "wrapped": False}


def test_a_loop_that_steps_an_optimizer_gets_torch_s_own_backward_back_at_its_first_step():
    got = _run(
        "before = wrapped()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "model(x).sum().backward(); opt.step()\n"
        "print(json.dumps({'before': before, 'after': wrapped(), 'said': runtime._agent.counted}))"
    )
    assert got == {"before": True, "after": False, "said": "1 step = 1 actors.agent.step() call"}


def test_outside_a_ray_train_worker_the_backward_watch_and_the_optimizer_hook_remove_themselves():
    got = _run(
        f"backward_passes({BACKWARDS_WITHOUT_OPTIMIZER + 2})\n"
        "print(json.dumps({'agent': runtime._agent is not None, 'wrapped': wrapped(), 'hooks': len(post_hooks)}))",
        in_worker=False,
    )
    assert got == {"agent": False, "wrapped": False, "hooks": 0}


def test_explicit_steps_replace_the_backward_count_rather_than_add_to_it():
    got = _run(
        f"backward_passes({BACKWARDS_WITHOUT_OPTIMIZER})\n"
        "for _ in range(4):\n"
        "    backward_passes(1); actors.agent.step()\n"
        "agent = runtime._agent\n"
        "print(json.dumps({'steps': agent.step_count, 'said': agent._heartbeat().step_definition, 'wrapped': wrapped()}))"
    )
    # The first backward pass after attaching counts; from the first explicit step on, only those do.
    assert got == {"steps": 5, "said": "1 step = 1 actors.agent.step() call", "wrapped": False}


def test_a_backward_pass_that_raises_is_no_step_and_its_error_reaches_the_loop():
    got = _run(
        f"backward_passes({BACKWARDS_WITHOUT_OPTIMIZER})\n"
        "try:\n"
        "    torch.zeros(1).backward()  # no grad_fn: torch's own error\n"
        "except RuntimeError as e:\n"
        "    error = str(e)\n"
        "print(json.dumps({'steps': runtime._agent.step_count, 'error': 'does not require grad' in error}))"
    )
    assert got == {"steps": 0, "error": True}


def test_the_backward_passes_reentrant_checkpointing_runs_inside_a_backward_pass_are_part_of_it():
    got = _run(
        "from torch.utils.checkpoint import checkpoint\n"
        "blocks = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))\n"
        "def checkpointed_passes(n):\n"
        "    for _ in range(n):\n"
        "        h = x.requires_grad_()\n"
        "        for block in blocks:\n"
        "            h = checkpoint(block, h, use_reentrant=True)  # a backward of its own per block\n"
        "        h.sum().backward()\n"
        f"checkpointed_passes({BACKWARDS_WITHOUT_OPTIMIZER + 4})\n"
        "print(json.dumps({'steps': runtime._agent.step_count}))"
    )
    assert got == {"steps": 4}
