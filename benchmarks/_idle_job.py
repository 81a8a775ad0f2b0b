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
    deadline = time.monotonic() + cfg["seconds"]
    while time.monotonic() < deadline:
        w0, c0 = time.perf_counter(), time.thread_time()
        run(per_block)
        blocks.append([(time.perf_counter() - w0) / per_block, (time.thread_time() - c0) / per_block])
    agent1, timed_s = _thread_use(agent), time.perf_counter() - start
    with open(cfg["out"], "w") as f:
        json.dump({
            "blocks": blocks,
            "torch_threads": torch.get_num_threads(),
            "agent_thread": agent is not None,
            "timed_s": timed_s,
            # What the agent's own thread did while the steps were timed: CPU seconds and wake-ups.
            "agent_cpu_s": agent1[0] - agent0[0],
            "agent_wakeups": agent1[1] - agent0[1],
        }, f)


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
