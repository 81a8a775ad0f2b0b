"""Record CPU-only traces of a LoRA fine-tune under transformers' Trainer (PEFT, unmodified), each with the steps
before its window as the agent measures and writes them (:mod:`orchestrator.models.pace`).

    PYTHONPATH=.:<peft> python tests/data/record_cpu_pace.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities, schedule(wait=WAIT, warmup=1,
active=ACTIVE). A two-layer GPT-2 built from a config (no download) wrapped by ``peft.get_peft_model`` with LoRA
adapters (r=8) on its attention and projection layers, trained by ``Trainer`` on synthetic token ids, one intra-op
thread, a TrainerCallback's on_step_end as the step boundary. The steps after the first and up to the window are
timed as the agent's heartbeats time them (time over steps, no profiler on), and written into the trace as the
agent writes them when the window opens; the agent's thread clock (CPU and kernel time, switches, page faults)
runs over the recorded steps:
  peft_lora_shapes  record_shapes=True: the recorded steps 3-9x the steps before the window in the committed
               recording (8.8x at the median), slower as the window went on; it was made before the recorder ran the
               thread clock. Four recordings half an hour later ran 1.06-1.37x, their thread 27-35 ms a step in the
               kernel on ~100k page faults: a first touch of memory costs what the host's memory state makes it
  peft_lora    the same without record_shapes: the window's steps within 5% of the steps before it (also made
               before the thread clock)
peft 0.21.2 is no dependency: install it beside the recorder to record (pip install --target DIR --no-deps peft).
"""

from __future__ import annotations

import gzip
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from actors.agent.thread_clock import ThreadClock  # noqa: E402
from orchestrator.loops import METADATA_KEY, loop_of_stack  # noqa: E402
from orchestrator.models.pace import STEPS_BEFORE_METADATA_KEY, StepsBefore  # noqa: E402
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY  # noqa: E402

WAIT = 16  # unprofiled steps: the first, then 15 timed (over a second at ~0.09 s a step, as the agent needs)
ACTIVE = 6


def _record(out: Path, name: str, record_shapes: bool) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=1000, n_positions=128,
                                      bos_token_id=0, eos_token_id=0))
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_proj"],
                                             fan_in_fan_out=True, task_type="CAUSAL_LM"))
    ids = torch.randint(0, 1000, (256, 64))
    rows = [{"input_ids": r, "labels": r} for r in ids]
    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"
    options = ["record_shapes"] if record_shapes else []

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=WAIT, warmup=1, active=ACTIVE),
                 record_shapes=record_shapes, on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:

        class Boundary(TrainerCallback):
            calls, began, clock = 0, 0.0, None

            def on_step_end(self, *_: object, **__: object) -> None:
                self.calls += 1
                if self.calls == 1:
                    self.began = time.monotonic()
                span = time.monotonic() - self.began
                if self.calls == WAIT + 1 + ACTIVE:  # the last recorded step ended: the agent's thread clock stops
                    prof.add_metadata_json(THREAD_TIME_METADATA_KEY, self.clock.stop().model_dump_json())
                prof.step()
                if self.calls == WAIT + 1:  # the boundary before the first recorded step: the clock starts
                    self.clock = ThreadClock()
                if self.calls == WAIT:  # the window opens (its warmup): the agent writes whose loop and the steps before it
                    prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))
                    seen = StepsBefore(step_ms=span / (WAIT - 1) * 1000, steps=WAIT - 1, span_s=span, options=options)
                    prof.add_metadata_json(STEPS_BEFORE_METADATA_KEY, seen.model_dump_json())

        args = TrainingArguments(
            output_dir=str(out / name / "run"), max_steps=WAIT + 1 + ACTIVE, per_device_train_batch_size=8,
            use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0,
        )
        Trainer(model=model, args=args, train_dataset=rows, callbacks=[Boundary()]).train()
    shutil.rmtree(out / name / "run", ignore_errors=True)
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


CASES = {
    "peft_lora_shapes": lambda out: _record(out, "peft_lora_shapes", True),
    "peft_lora": lambda out: _record(out, "peft_lora", False),
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in sys.argv[2:] or list(CASES):
        CASES[case](target)
