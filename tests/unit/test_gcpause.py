"""gc_paused: the collector is off inside a rank's work and restored after, and the work still pickles."""

from __future__ import annotations

import gc
import pickle

import pytest

from orchestrator.analysis import analyze_and_scan
from orchestrator.traces.gcpause import gc_paused
from orchestrator.traces.merge_write import write_rank


@gc_paused
def _enabled_inside() -> bool:
    return gc.isenabled()


@gc_paused
def _fails() -> None:
    raise RuntimeError("boom")


def test_off_inside_and_restored_after() -> None:
    assert gc.isenabled()
    assert _enabled_inside() is False
    assert gc.isenabled()


def test_restored_after_an_exception() -> None:
    with pytest.raises(RuntimeError):
        _fails()
    assert gc.isenabled()


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        assert _enabled_inside() is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_rank_functions_still_pickle_by_name() -> None:
    # Process pools and Ray ship the per-rank functions by reference.
    for fn in (analyze_and_scan, write_rank):
        assert pickle.loads(pickle.dumps(fn)) is fn
