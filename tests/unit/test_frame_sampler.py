"""The agent's samples of the training thread's stack while a window records, and how they reach the trace."""

from __future__ import annotations

import sys
import threading

from actors.agent import capture as capture_module
from actors.agent.capture import Capture
from actors.agent.frame_sampler import FrameSampler
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from tests.support.tracefiles import load_trace
from tests.unit.test_capture import INFO, _train, _window

NOW_NS = 1_800_000_000_000_000_000


def _sampler(max_samples: int = 100, interval_s: float = 0.01) -> FrameSampler:
    return FrameSampler(threading.get_ident(), interval_s, max_samples, clock_ns=lambda: NOW_NS)


def _marked_function(sampler: FrameSampler) -> None:
    sampler.sample()


def test_a_sample_names_the_threads_stack_innermost_first_as_with_stack_names_frames():
    sampler = _sampler()
    _marked_function(sampler)
    samples = sampler.stop()
    assert samples is not None and samples.samples == [(NOW_NS // 1000, 0)]
    # The agent's own frames on top (here the sampler's, sampling its own thread) are left out.
    innermost = samples.stacks[0][0]
    assert innermost.startswith("tests/unit/test_frame_sampler.py(") and innermost.endswith("): _marked_function")
    assert not any(frame.startswith("actors/agent/") for frame in samples.stacks[0])


def test_a_stack_seen_again_is_stored_once():
    sampler = _sampler()
    for _ in range(3):
        _marked_function(sampler)
    samples = sampler.stop()
    assert len(samples.stacks) == 1 and [i for _, i in samples.samples] == [0, 0, 0]


def test_a_sampler_that_saw_nothing_returns_none():
    assert _sampler().stop() is None


def test_sampling_stops_at_its_cap_and_says_so():
    sampler = _sampler(max_samples=3, interval_s=0.001)
    sampler.start()
    sampler._thread.join(60)  # it ends itself at the cap
    samples = sampler.stop()
    assert samples is not None and len(samples.samples) == 3 and samples.truncated


def test_sampling_ends_with_the_thread_it_samples():
    # A job that ends inside a window never closes it: the sampler must not outlive the thread. An ended thread's
    # ident is free for the next thread (the sampler's own, even), so the gone thread is one no thread has: 1 is
    # no pthread's.
    assert 1 not in sys._current_frames()
    sampler = FrameSampler(1, 0.001, 1_000)
    sampler.start()
    sampler._thread.join(60)
    assert not sampler._thread.is_alive() and sampler.stop() is None


def test_what_the_sampler_returns_is_the_contract_the_analysis_reads():
    sampler = _sampler()
    _marked_function(sampler)
    sent = sampler.stop()
    assert FrameSamples.model_validate_json(sent.model_dump_json()) == FrameSamples.model_validate(sent.model_dump())


def test_the_window_writes_its_samples_into_the_trace(tmp_path, monkeypatch):
    class SampledOnStop(FrameSampler):  # one sample, taken on the training thread as the window closes
        def start(self) -> None:
            pass

        def stop(self) -> FrameSamples | None:
            self.sample()
            return super().stop()

    monkeypatch.setattr(capture_module, "FrameSampler", SampledOnStop)
    events = []
    _train(Capture(_window(tmp_path, start=2, steps=2), INFO, events.append, lambda: None), range(1, 6))
    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    samples = FrameSamples.model_validate(trace[FRAMES_METADATA_KEY])
    assert len(samples.samples) == 1 and any("): _train" in frame for frame in samples.stacks[0])


def test_sampling_turned_off_writes_no_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPROF_FRAME_SAMPLE_MS", "0")
    _train(Capture(_window(tmp_path, start=2, steps=2), INFO, lambda e: None, lambda: None), range(1, 6))
    trace = load_trace(tmp_path / "store" / "unit" / "p1" / "traces" / "rank0.h.1.pt.trace.json.gz")
    assert FRAMES_METADATA_KEY not in trace
