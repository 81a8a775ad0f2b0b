"""One Ray Train job for ``idle_process``: a one-rank loop of ~0.1 ms steps, timed in blocks.

    python -m benchmarks._idle_job ADDRESS none|hook OUT.json RUN_NAME SECONDS

Its own driver, so each job gets the runtime_env under test (with or without
rayprof's setup hook) on the one shared cluster. The train function leaves
torch's thread count as Ray set it: that is part of what a hook can disturb.
"""

from __future__ import annotations

import json
import sys
import tempfile


def train_fn(cfg: dict) -> None:
    import threading
    import time

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def run(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

    run(3000)  # warm up; the agent (if any) attaches at the first of these steps
    agent = next((t for t in threading.enumerate() if t.name == "rayprof-agent"), None)
    per_block, blocks = 400, []
    agent0, start = _thread_use(agent), time.perf_counter()
    process0, train0 = time.process_time(), time.thread_time()
    deadline = time.monotonic() + cfg["seconds"]
    while time.monotonic() < deadline:
        w0, c0 = time.perf_counter(), time.thread_time()
        run(per_block)
        blocks.append([(time.perf_counter() - w0) / per_block, (time.thread_time() - c0) / per_block])
    agent1, timed_s = _thread_use(agent), time.perf_counter() - start
    train_cpu_s = time.thread_time() - train0
    others_cpu_s = time.process_time() - process0 - train_cpu_s
    hook_s = _hook_cost_s() if agent is not None else 0.0
    with open(cfg["out"], "w") as f:
        json.dump({
            "blocks": blocks,
            "torch_threads": torch.get_num_threads(),
            "agent_thread": agent is not None,
            "timed_s": timed_s,
            # What the agent's own thread did while the steps were timed: CPU seconds and wake-ups.
            "agent_cpu_s": agent1[0] - agent0[0],
            "agent_wakeups": agent1[1] - agent0[1],
            # CPU the process's other threads (Ray's core worker, the agent) took meanwhile, against
            # the training thread's: work, not speed, so a noisy box shifts it far less than time.
            "steps": per_block * len(blocks),
            "train_cpu_s": train_cpu_s,
            "others_cpu_s": others_cpu_s,
            "hook_s": hook_s,
        }, f)


def _hook_cost_s() -> float:
    """What the optimizer hooks add to one optimizer step here: an optimizer that does nothing, stepped
    in short runs with torch's global post-hooks in place and set aside by turns; the median of the
    pairs' differences (adjacent runs share the machine's momentary speed). Run after the timed blocks:
    the agent counts these steps as training steps."""
    import statistics
    import time

    import torch
    from torch.optim import optimizer as torch_optimizer

    class Nothing(torch.optim.Optimizer):
        def step(self, closure=None):
            return None

    nothing = Nothing([torch.zeros(1, requires_grad=True)], {})
    hooks = torch_optimizer._global_optimizer_post_hooks
    held = dict(hooks)

    def per_step(hooked: bool, n: int = 2000) -> float:
        if hooked:
            hooks.update(held)
        else:
            hooks.clear()
        t0 = time.perf_counter()
        for _ in range(n):
            nothing.step()
        return (time.perf_counter() - t0) / n

    differences = []
    try:
        for i in range(60):
            first, second = (True, False) if i % 2 == 0 else (False, True)
            a, b = per_step(first), per_step(second)
            differences.append(a - b if first else b - a)
    finally:
        hooks.update(held)
    return statistics.median(differences)


def _thread_use(thread) -> tuple[float, int]:
    """CPU seconds (ns clock of that thread) and context switches (each a wake-up) of ``thread`` so far."""
    import time

    if thread is None:
        return (0.0, 0)
    cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    return (cpu, switches)


def main() -> None:
    address, mode, out, name, seconds = sys.argv[1:6]
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    env = {"worker_process_setup_hook": "actors.agent.install"} if mode == "hook" else {}
    ray.init(address=address, runtime_env=env, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="rayprof-idle-") as storage:
        TorchTrainer(
            train_fn,
            train_loop_config={"seconds": float(seconds), "out": out},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name=name, storage_path=storage),
        ).fit()


if __name__ == "__main__":
    main()
