"""Record CPU-only traces of a sentence-transformers fine-tune under its trainer (unmodified): an embedding model's
contrastive training, and the same with an evaluator run every step or every other step.

    PYTHONPATH=.:<sentence-transformers and its dependencies> python tests/data/record_cpu_sentence_transformers.py OUT [CASE ...]

Each case lands as ``OUT/<case>/traces/rank0.pt.trace.json.gz``: CPU activities, schedule(wait=1, warmup=1, active=3),
so steps 2-4 of 5, with the agent's stack samples (every 5 ms, tests/data/sampled.py) over the recorded steps and
whose loop it is as the agent reads it. A two-layer BERT (hidden 128, 4 heads, vocab 1000) built from a config and
saved to a temporary folder (no download), a word-level tokenizer built in code, wrapped as
SentenceTransformer(Transformer + Pooling(mean)); synthetic (anchor, positive) pairs of random words;
MultipleNegativesRankingLoss; batch 16; one intra-op thread; a TrainerCallback's on_step_end as the step boundary.
  cpu_st_mnrl         the fine-tune alone (12-word anchors, 16-word positives, max_seq_length 64): healthy, forward and
                      backward 84% of the step (measured unprofiled), the collator's tokenizing 5%
  cpu_st_evaluator    with an EmbeddingSimilarityEvaluator (256 pairs) run every step (eval_steps=1): the evaluation
                      80% of the time, measured unprofiled
  cpu_st_eval_every2  the same with eval_steps=2: the evaluation in recorded steps 2 and 4, 64% of the time
  cpu_st_truncated    1500-word texts cut to max_seq_length 32: the collator tokenizes whole documents in the step's
                      process, 36-46% of the step (one DataLoader worker: 95-105 ms a step to 60-65 ms)
sentence-transformers 6.2.0 is no dependency: install it beside the recorder to record (pip install --target DIR
--no-deps sentence-transformers==6.2.0 scipy scikit-learn joblib threadpoolctl).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS = 5
WORK = Path(tempfile.mkdtemp(prefix="record-st-"))


def _base_model_dir() -> Path:
    """Tiny BERT + word-level tokenizer saved once to disk, so sentence-transformers' Transformer can load it offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    path = WORK / "tinybert"
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(996)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                        sep_token="[SEP]", model_max_length=512)
    model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
                                 vocab_size=1000, max_position_embeddings=512, pad_token_id=0))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build(name: str, max_seq_length: int = 64, anchor_words: int = 12, positive_words: int = 16, n_pairs: int = 512,
          evaluator: bool = False, **options: Any) -> Any:
    """The trainer for one case (not yet trained)."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    path = _base_model_dir()
    transformer = Transformer(str(path), max_seq_length=max_seq_length)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling], device="cpu")
    g = torch.Generator().manual_seed(0)

    def sentence(n: int) -> str:
        return " ".join(f"w{int(t)}" for t in torch.randint(0, 996, (n,), generator=g))

    data = Dataset.from_dict({"anchor": [sentence(anchor_words) for _ in range(n_pairs)],
                              "positive": [sentence(positive_words) for _ in range(n_pairs)]})
    extra: dict[str, Any] = {}
    if evaluator:
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

        n = 256
        extra["evaluator"] = EmbeddingSimilarityEvaluator(
            [sentence(anchor_words) for _ in range(n)], [sentence(positive_words) for _ in range(n)],
            torch.rand(n, generator=g).tolist(), batch_size=32, name="sts-synthetic", show_progress_bar=False)
        options = {"eval_strategy": "steps", "eval_steps": 1, **options}  # eval_steps may be overridden
    options = dict(options)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(WORK / "runs" / name), max_steps=options.pop("max_steps", STEPS), per_device_train_batch_size=16, use_cpu=True,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, **{"dataloader_num_workers": 0, **options})
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                      loss=MultipleNegativesRankingLoss(model), **extra)


def _record(out: Path, name: str, **options: Any) -> None:
    from sampled import SampledSteps
    from transformers import TrainerCallback

    from orchestrator.loops import METADATA_KEY, loop_of_stack

    folder = out / name / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.pt.trace.json"

    class Step(TrainerCallback):
        def __init__(self, prof: Any) -> None:
            self.prof = prof

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.prof.step()
            if self.prof.calls == 2:  # as the agent does once the window records: whose loop steps the optimizer
                prof.add_metadata(METADATA_KEY, getattr(loop_of_stack(sys._getframe()), "value", "none"))

    trainer = build(name, **options)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        boundary = SampledSteps(prof, first=2, last=STEPS, interval_s=0.005)
        trainer.add_callback(Step(boundary))
        trainer.train()
    shutil.rmtree(WORK / "runs" / name, ignore_errors=True)
    with raw.open("rb") as src, gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


CASES: dict[str, dict[str, Any]] = {
    "cpu_st_mnrl": {},
    "cpu_st_evaluator": {"evaluator": True},
    "cpu_st_eval_every2": {"evaluator": True, "eval_steps": 2},
    "cpu_st_truncated": {"max_seq_length": 32, "anchor_words": 1500, "positive_words": 1500},
}

if __name__ == "__main__":
    target = Path(sys.argv[1])
    try:
        for case in sys.argv[2:] or list(CASES):
            _record(target, case, **CASES[case])
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
