"""Record a CPU-only trace of a PyTorch Geometric training loop whose DataLoader workers compete with the step for
the host's cores, with plain torch.profiler.

    PYTHONPATH=.:<torch_geometric> python tests/data/record_cpu_pyg.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities only, schedule(wait=1, warmup=1,
active=8), record_shapes=True, with the agent's stack sampler, thread clock and gc watch. A two-layer GCN
(``GCNConv`` ×2, ``global_mean_pool``, a linear head) on one intra-op thread, trained with Adam on batches of 32 random
graphs (10-40 nodes, four edges a node) from ``torch_geometric.loader.DataLoader``, the job's own loop:
  pyg_gcn_workers  num_workers=2 on the 2-core box: each batch is built and sent from a worker process while the step
                   runs (recorded beside it: in the step's own process 1.8 ms of a 6.6 ms step; with one worker
                   4.5 ms of 10.2 ms)
torch_geometric 2.8.1 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps
torch_geometric xxhash). Each recording takes seconds (torch 2.13.0+cpu).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from record_cpu_loops import STEPS, recording  # noqa: E402

from orchestrator.settings import DEFAULT_FRAME_SAMPLE_MS  # noqa: E402
from tests.data.sampled import SampledSteps  # noqa: E402

BATCH = 32


def case_gcn(out: Path, name: str, workers: int) -> None:
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GCNConv, global_mean_pool

    torch.set_num_threads(1)
    torch.manual_seed(0)
    graphs = []
    for _ in range(BATCH * (STEPS + 2)):
        n = int(torch.randint(10, 40, ()))
        graphs.append(Data(x=torch.randn(n, 32), edge_index=torch.randint(0, n, (2, 4 * n)), y=torch.randint(0, 4, (1,))))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.head = GCNConv(32, 64), GCNConv(64, 64), torch.nn.Linear(64, 4)

        def forward(self, d: Data) -> torch.Tensor:
            h = self.c2(self.c1(d.x, d.edge_index).relu(), d.edge_index).relu()
            return self.head(global_mean_pool(h, d.batch))

    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    with recording(out, name) as prof:
        steps = SampledSteps(prof, first=2, last=STEPS, interval_s=DEFAULT_FRAME_SAMPLE_MS / 1000)
        for batch in DataLoader(graphs, batch_size=BATCH, shuffle=True, num_workers=workers):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(batch), batch.y).backward()
            opt.step()
            if steps.calls == STEPS:
                break
            steps.step()


CASES = {"pyg_gcn_workers": lambda out: case_gcn(out, "pyg_gcn_workers", 2)}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
