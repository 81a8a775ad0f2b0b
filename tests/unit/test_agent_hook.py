"""The setup hook runs at worker start, before Ray assigns the worker its CPUs: it must leave torch alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import REPO


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_setup_hook_leaves_torch_to_read_the_thread_count_ray_sets_after_it():
    # Ray runs the hook, then sets OMP_NUM_THREADS for the task it hands the worker;
    # torch reads it once, at import. A hook that imported torch froze one thread per core.
    # Ray gives a 1-CPU task OMP_NUM_THREADS=1; torch left alone would take every core.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("on one core torch's default and Ray's count are the same")
    wanted = 1
    got = _run(
        "import json, os\n"
        "import actors.agent\n"
        "actors.agent.install()\n"
        f"os.environ['OMP_NUM_THREADS'] = '{wanted}'\n"
        "import torch\n"
        "print(json.dumps({'threads': torch.get_num_threads()}))",
        env={"OMP_NUM_THREADS": ""},
    )
    assert got["threads"] == wanted


def test_installing_the_hook_imports_neither_torch_nor_pydantic():
    got = _run(
        "import json, sys\n"
        "import actors.agent\n"
        "actors.agent.install()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pydantic', 'orchestrator'))))"
    )
    assert got == []


def test_the_hook_is_registered_when_the_training_code_imports_torch():
    got = _run(
        "import json\n"
        "import actors.agent\n"
        "actors.agent.install()\n"
        "from torch.optim.optimizer import _global_optimizer_post_hooks as hooks\n"
        "print(json.dumps([h.__name__ for h in hooks.values()]))"
    )
    assert got == ["_first_step"]


def test_the_hook_is_registered_at_once_when_torch_was_imported_before_it():
    got = _run(
        "import json\n"
        "import torch\n"
        "import actors.agent\n"
        "actors.agent.install(); actors.agent.install()\n"
        "from torch.optim.optimizer import _global_optimizer_post_hooks as hooks\n"
        "print(json.dumps([h.__name__ for h in hooks.values()]))"
    )
    assert got == ["_first_step"]


def test_outside_a_ray_train_worker_the_hook_removes_itself_at_the_first_step():
    got = _run(
        "import json\n"
        "import actors.agent\n"
        "actors.agent.install()\n"
        "import torch\n"
        "from torch.optim.optimizer import _global_optimizer_post_hooks as hooks\n"
        "p = torch.zeros(1, requires_grad=True); p.grad = torch.zeros(1)\n"
        "opt = torch.optim.SGD([p], lr=0.1); opt.step(); opt.step()\n"
        "from actors.agent import runtime\n"
        "print(json.dumps({'hooks': len(hooks), 'agent': runtime._agent is not None}))"
    )
    assert got == {"hooks": 0, "agent": False}
