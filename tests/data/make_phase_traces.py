"""Record the closure-optimizer trace fixtures under tests/data/traces/ (CPU, one process).

    python tests/data/make_phase_traces.py [case ...]

Cases (issue 29, phases from nesting):
  closure_adam  Lightning's pattern: ``optimizer.step(closure)`` with Adam, the closure runs
                zero_grad, forward, loss and backward inside ``Optimizer.step#Adam.step``
  closure_lbfgs LBFGS, whose step calls the closure itself
  compiled_autograd
                torch.compile'd model (backend "eager") and loss.backward() under compiled autograd:
                backward runs as a ``Torch-Compiled Region: !0/...`` span
  gan           a GAN's iteration (what one step holds): the discriminator's step (SGD) on a real and a fake
                batch, then the generator's (Adam), with the Python tracer on so modules get ``nn.Module:``
                spans: 1 forward of the generator, 3 of the discriminator, the loss module's left out

Each records steps 2-4 with torch.profiler, as ``<case>/traces/rank0.pt.trace.json.gz``.
The tests assert only that backward and forward are found inside the optimizer step,
not this machine's speed, so re-recording keeps them true.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(__file__).parent / "traces"


def record(case: str) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    params = model.parameters()
    opt: torch.optim.Optimizer = torch.optim.LBFGS(params, max_iter=2) if case == "closure_lbfgs" else torch.optim.Adam(params)
    x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    compiled = torch.compile(model, backend="eager")

    def compiled_step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
        opt.step()

    gen = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128))
    disc = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    bce = torch.nn.BCEWithLogitsLoss()
    opt_d, opt_g = torch.optim.SGD(disc.parameters(), lr=0.01), torch.optim.Adam(gen.parameters())
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)

    def gan_step() -> None:
        fake = gen(torch.randn(64, 16))
        opt_d.zero_grad()
        (bce(disc(torch.randn(64, 128)), ones) + bce(disc(fake.detach()), zeros)).backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(disc(fake), ones).backward()
        opt_g.step()

    folder = OUT / case / "traces"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "rank0.pt.trace.json"
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=3),
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
            with_stack=case == "gan",
        ) as prof:
            for _ in range(5):
                if case == "gan":
                    gan_step()
                elif case == "compiled_autograd":
                    compiled_step()
                else:
                    opt.step(closure)
                prof.step()
        with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    return folder


if __name__ == "__main__":
    for name in sys.argv[1:] or ("closure_adam", "closure_lbfgs", "compiled_autograd", "gan"):
        print(record(name))
