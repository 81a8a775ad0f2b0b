"""A DataLoader's hot path named from the agent's stack samples where the trace has no with_stack frames, and its
fix fitted to what it computes (orchestrator.analysis.data_fix over RankSummary.data_frames).

Recorded by tests/data/record_cpu_sentence_transformers.py (cpu_st_truncated): sentence-transformers' collator
tokenizes 1500-word texts in the step's own process to keep 32 tokens of each. Before: the finding's evidence named no
frame and its fix moved per-item work "out of __getitem__", though __getitem__ does nothing and the samples put the
time in the tokenizer under the collator.
"""

from __future__ import annotations

from orchestrator.analysis import analyze_folder
from tests.support.tracefiles import case, shared


def test_a_collators_tokenizer_is_named_from_the_samples_with_the_trainers_workers():
    found = analyze_folder(case("cpu_st_truncated")).findings[0]
    assert found.code == "dataloader_bound"
    assert "of it is in TokenizersBackend._encode_plus (transformers/tokenization_utils_tokenizers.py:" in found.evidence
    assert "TrainingArguments(dataloader_num_workers=N" in found.fix
    assert "tokenizing each batch: tokenize once, ahead" in found.fix and "__getitem__" not in found.fix


def test_a_cpu_only_job_is_not_told_to_pin_memory():
    # Pinned memory speeds a copy to a device; a CPU-only job makes none (torch warns and ignores pin_memory there).
    found = analyze_folder(case("cpu_data_bound")).findings[0]
    assert found.code == "dataloader_bound" and "num_workers" in found.fix and "pin_memory" not in found.fix


def test_a_gpu_job_is_still_told_to_pin_memory():
    # The H100 recording of a DataLoader-bound step: its batches are copied to the device.
    found = analyze_folder(shared("gpu-traces", "seed003_before")).findings[0]
    assert found.code == "dataloader_bound" and "pin_memory=True" in found.fix
