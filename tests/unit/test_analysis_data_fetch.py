"""A DataLoader's time that is its per-sample overhead (samples in memory fetched and stacked one by one) is told to
fetch each batch with one index; a loader that works on each sample, builds whole batches, or costs one step is not."""

from __future__ import annotations

import functools

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.models.analysis import Finding
from tests.support.realtraces import external
from tests.support.tracefiles import case

ONE_INDEX = "fetch each batch with one index"
WORKERS = "raise DataLoader num_workers"


@functools.cache
def _cpu(name: str) -> Summary:
    return analyze_folder(case(f"cpu_{name}"))


def _data(summary: Summary) -> Finding:
    (found,) = [f for f in summary.findings if f.code == "dataloader_bound"]
    return found


def test_a_loader_fetching_in_memory_samples_one_by_one_is_told_to_fetch_each_batch_with_one_index():
    # tests/data/record_cpu_loops.py tensor_dataset: DataLoader(TensorDataset, batch_size=256) over tensors in memory,
    # 75% of a 2.0 ms step: 256 samples indexed (two selects each) and stacked. By hand, the same loop without the
    # profiler: 0.82 ms a step, 0.34 ms with BatchSampler(RandomSampler(ds), 256) and batch_size=None.
    summary = _cpu("tensor_dataset")
    assert summary.findings[0].code == "dataloader_bound"
    fix = _data(summary).fix
    assert fix.startswith("The loader's time is its per-sample overhead (514 ops a step at ")
    assert "DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size, drop_last=False), batch_size=None)" in fix
    assert WORKERS not in fix


def test_a_loader_that_works_on_each_sample_keeps_the_workers_fix():
    # numpy work in __getitem__ (139 µs an op), and a Keras fit() over a DataLoader decoding each sample (170 µs).
    for name in ("data_bound", "keras_loader"):
        fix = _data(_cpu(name)).fix
        assert WORKERS in fix and ONE_INDEX not in fix, name


def test_a_dataset_that_builds_whole_batches_runs_many_cheap_ops_but_fetches_no_sample_one_by_one():
    # PARAM's DLRM generates each batch in one __getitem__ (159 ops a call at 8.2 µs, per embedding table) and
    # concatenates: no stack, so no per-sample fetch.
    summary = external("param_dlrm_v100_8ranks")
    assert all(r.data_ops == 0 for r in summary.ranks)
    fix = _data(summary).fix
    assert WORKERS in fix and ONE_INDEX not in fix


def test_a_loader_whose_time_is_one_steps_keeps_the_workers_fix():
    # An Accelerate loop over a TensorDataset (66 ops a call at 3.8 µs), but 80% of the window's loading is one step's:
    # what its ops cost a step is not what that step paid.
    summary = _cpu("accelerate")
    assert all(r.data_ops >= 32 for r in summary.ranks)
    found = _data(summary)
    assert "of it in step" in found.title
    assert WORKERS in found.fix and ONE_INDEX not in found.fix
