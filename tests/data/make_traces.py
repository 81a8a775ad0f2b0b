"""Record the real trace fixtures under tests/data/traces/ (CPU, gloo, 2 ranks).

    python tests/data/make_traces.py            # all cases
    python tests/data/make_traces.py straggler  # one case

Each job trains a small CNN on synthetic data with DistributedDataParallel
over gloo on 127.0.0.1 and records steps PROFILE_START+1 .. PROFILE_START+ACTIVE
with torch.profiler, numbered by *global* step (``ProfilerStep#121`` ..), the
way the capture agent does, then writes what the capture pipeline writes:
``<case>/traces/rank{R}.{host}.{pid}.pt.trace.json.gz``.

Cases:
  healthy          compute-bound, nothing to fix
  dataloader_bound Dataset.__getitem__ sleeps, num_workers=0: the loader dominates
  straggler        rank 1 sleeps inside its model's forward
  loss_item        calls loss.item() every step
  duplicate_rank, unparseable, no_distributed_info
                   plain folders derived from healthy/ for the loader's edge cases

The numbers in the tests rely on the deliberate effects (sleeps of tens of ms),
not on this machine's speed, so re-recording keeps them true.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

OUT = Path(__file__).parent / "traces"
WORLD_SIZE = 2
PRE_STEPS = 2  # untraced steps before the window, as in a live job
PROFILE_START = 120  # global step number of the profiler's warmup step
ACTIVE = 4
BATCH = 8


class Synthetic(Dataset):
    """Random images; ``delay_s`` per item makes the loader slow on purpose."""

    def __init__(self, n: int, size: int, delay_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


class Net(nn.Module):
    """Few parameters (cheap allreduce), many FLOPs (compute-bound step)."""

    def __init__(self, forward_delay_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4)
        )
        self.head = nn.Linear(16 * 16, 10)
        self.forward_delay_s = forward_delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_delay_s:
            time.sleep(self.forward_delay_s)  # the straggler: slow in forward only
        return self.head(self.body(x).flatten(1))


CASES: dict[str, dict[str, object]] = {
    "healthy": {},
    "dataloader_bound": {"item_delay_s": 0.006},
    "straggler": {"slow_rank": 1, "forward_delay_s": 0.05},
    "loss_item": {"loss_item": True},
}


def _worker(rank: int, case: str, port: int, out: str) -> None:
    cfg = CASES[case]
    torch.set_num_threads(1)  # two ranks share two cores: no oversubscription noise
    torch.manual_seed(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    delay = float(cfg.get("forward_delay_s", 0.0)) if cfg.get("slow_rank") == rank else 0.0
    model = nn.parallel.DistributedDataParallel(Net(delay))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = PRE_STEPS + 1 + ACTIVE
    data = Synthetic(BATCH * steps, 64, float(cfg.get("item_delay_s", 0.0)))
    batches = iter(DataLoader(data, batch_size=BATCH, num_workers=0))

    losses: list[float] = []

    def train_step() -> None:
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if cfg.get("loss_item"):
            losses.append(loss.item())  # the anti-pattern under test: a host sync per step

    for _ in range(PRE_STEPS):
        train_step()
    # Number the profiler's steps by global step, as the capture agent does:
    # the schedule counts from the window start, step_num carries the global number.
    inner = schedule(wait=0, warmup=1, active=ACTIVE, repeat=1)
    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=lambda s: inner(max(s - PROFILE_START, 0)),
        profile_memory=True,
    )
    prof.step_num = PROFILE_START
    with prof:
        for _ in range(1 + ACTIVE):
            train_step()
            prof.step()
    name = f"rank{rank}.{socket.gethostname()}.{os.getpid()}.pt.trace.json"
    tmp = Path(out) / name
    prof.export_chrome_trace(str(tmp))
    with open(tmp, "rb") as src, gzip.open(f"{tmp}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    tmp.unlink()
    dist.destroy_process_group()


def record(case: str, port: int) -> Path:
    """Run one 2-rank job and leave its traces in ``OUT/case/traces``."""
    folder = OUT / case / "traces"
    shutil.rmtree(OUT / case, ignore_errors=True)
    folder.mkdir(parents=True)
    mp.spawn(_worker, args=(case, port, str(folder)), nprocs=WORLD_SIZE)
    return folder


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _dump(doc: dict, path: Path) -> None:
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(doc, f)


def derive_edge_cases() -> None:
    """Plain folders made from healthy/ that exercise the loader's rejections."""
    src = sorted((OUT / "healthy" / "traces").glob("rank*.pt.trace.json.gz"))
    r0, r1 = _load(src[0]), _load(src[1])
    for case in ("duplicate_rank", "unparseable", "no_distributed_info"):
        shutil.rmtree(OUT / case, ignore_errors=True)
        (OUT / case).mkdir(parents=True)

    # Two files claim rank 1; neither may silently win.
    _dump(r0, OUT / "duplicate_rank" / "worker-a.pt.trace.json.gz")
    _dump(r1, OUT / "duplicate_rank" / "worker-b.pt.trace.json.gz")
    _dump(r1, OUT / "duplicate_rank" / "worker-c.pt.trace.json.gz")

    # One good rank, one truncated gzip, one file that is not JSON at all.
    _dump(r0, OUT / "unparseable" / "rank0.pt.trace.json.gz")
    blob = gzip.compress(json.dumps(r1).encode())
    (OUT / "unparseable" / "rank1.pt.trace.json.gz").write_bytes(blob[: len(blob) // 2])
    (OUT / "unparseable" / "rank2.pt.trace.json").write_text("<html>proxy error</html>")

    # No distributedInfo: the name's rank<N> is used, a name without one is rejected.
    for doc in (r0, r1):
        doc.pop("distributedInfo")
    _dump(r0, OUT / "no_distributed_info" / "rank0.pt.trace.json.gz")
    _dump(r1, OUT / "no_distributed_info" / "trainer.pt.trace.json.gz")


def main(argv: list[str]) -> None:
    cases = argv or [*CASES, "edge"]
    for i, case in enumerate(cases):
        if case == "edge":
            derive_edge_cases()
        else:
            print("recording", case, "->", record(case, 29500 + i))


if __name__ == "__main__":
    main(sys.argv[1:])
