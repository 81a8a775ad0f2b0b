"""A training process killed while it uploads a window's trace, as Ray Train kills a worker whose run ended.

``python -m tests.support.killed_upload STORE``: trains a tiny model through one profiling window and, when the
agent's finisher opens the storage to upload, kills itself with SIGKILL (no ``finally``, no ``atexit``).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import torch

from actors.agent import capture as capture_module
from actors.agent.capture import Capture
from orchestrator.models.agent_protocol import StorageSpec, WindowSpec, WorkerInfo
from orchestrator.models.requests import TorchOptions


def _killed(*_: object) -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def main(store: Path) -> None:
    info = WorkerInfo(
        agent_id="a1", target="unit", world_rank=0, world_size=1, local_rank=0, node_rank=0,
        node_id="n", host="h", pid=os.getpid(), device="cpu", torch_version=torch.__version__,
    )
    window = WindowSpec(
        profile_id="p1", target="unit", start_step=2, steps=1, warmup=0, options=TorchOptions(),
        storage=StorageSpec(uri=str(store)), prefix="unit/p1", max_trace_bytes=10**9,
    )
    capture_module.open_storage = _killed  # type: ignore[assignment]
    capture = Capture(window, info, lambda event: None, lambda: None)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        capture.on_boundary(step)
    assert capture.finisher is not None
    capture.finisher.join(120)
    raise SystemExit("the upload was never reached")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
