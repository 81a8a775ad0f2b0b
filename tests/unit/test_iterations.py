"""Iterations of a trace without ProfilerStep spans: where each starts, and when a repeating pattern is one.

Traces are planted as the main thread's top-level spans, 1 ms apart unless a span says otherwise; the
real cases they stand for are named in each test.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis.iterations import find_iterations
from orchestrator.traces.loader import Span

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
STEP = "Optimizer.step#SGD.step"
ZERO = "Optimizer.zero_grad#SGD.zero_grad"


def plant(names: Sequence[str | tuple[str, float]]) -> list[Span]:
    """Back-to-back spans; a (name, ms) pair lasts that long, a bare name 1 ms."""
    spans, t = [], 0.0
    for item in names:
        name, ms = item if isinstance(item, tuple) else (item, 1.0)
        cat = "user_annotation" if name.startswith(("Optimizer.", "enumerate(")) else "cpu_op"
        spans.append(Span(ts=t, end=t + ms * 1000, name=name, cat=cat, pid=1, tid=1))
        t += ms * 1000
    return spans


def whole(spans: Sequence[Span]) -> tuple[float, float]:
    return spans[0].ts, spans[-1].end


FORWARD = ["aten::conv2d", "aten::relu", "aten::max_pool2d", "aten::linear", "aten::nll_loss"]


def test_training_iterations_after_a_long_warm_up_are_iterations() -> None:
    # ResNet-50 under the autograd profiler (TensorBoard plugin sample): a 3.1 s first forward, then iterations that
    # cover 41% of the device's active span. Their period holds the DataLoader's next() and the optimizer step.
    loop = [LOADER, "aten::to", *FORWARD, ZERO, "aten::ones_like", STEP]
    spans = plant([("aten::to", 1.0), ("aten::conv2d", 3000.0), *FORWARD[1:], ZERO, "aten::ones_like", STEP, *loop * 5])
    windows, marker = find_iterations(spans, whole(spans))
    assert marker == LOADER and len(windows) == 5


def test_a_pattern_inside_one_part_of_the_run_is_no_iteration() -> None:
    # A layer's ops repeated in one stretch of an inference run: no loader, no optimizer step, 10% of the span.
    spans = plant([("aten::embedding", 900.0), *["aten::linear", "aten::gelu", "aten::add"] * 30, ("aten::argmax", 900.0)])
    assert find_iterations(spans, whole(spans)) == ([], "")


def test_an_iteration_starts_after_the_optimizer_step_not_mid_forward() -> None:
    # TraceLens' MI300 ResNet-18 trace: no loader; each iteration is forward, backward, step, loss.item(), zero_grad.
    # Before: the earliest repeating name, aten::max_pool2d, cut every iteration mid-forward.
    loop = [*FORWARD, "aten::ones_like", STEP, "aten::item", ZERO]
    spans = plant(["aten::conv2d", "aten::relu", *loop * 5])
    windows, marker = find_iterations(spans, whole(spans))
    assert marker == ZERO
    assert [spans[[s.ts for s in spans].index(a)].name for a, _ in windows] == [ZERO] * len(windows)


def test_a_marker_that_leaves_the_last_iteration_a_stub_drops_it() -> None:
    # The last zero_grad is the trace's last span: the iteration it would start was not recorded.
    loop = [*FORWARD, STEP, ZERO]
    spans = plant(["aten::conv2d", *loop * 4])
    windows, marker = find_iterations(spans, whole(spans))
    assert marker == ZERO and len(windows) == 3
    assert windows[-1][1] == spans[-1].ts


def test_the_dataloader_marks_the_start_whatever_follows_the_step() -> None:
    loop = [LOADER, *FORWARD, STEP, "aten::zeros"]
    spans = plant([*FORWARD, STEP, *loop * 4])
    assert find_iterations(spans, whole(spans))[1] == LOADER


_NAMES = st.sampled_from([LOADER, STEP, ZERO, "aten::item", *FORWARD])


@given(
    st.lists(_NAMES, max_size=12),
    st.lists(_NAMES, min_size=1, max_size=12),
    st.integers(min_value=0, max_value=8),
    st.lists(_NAMES, max_size=12),
    st.lists(st.floats(min_value=0.001, max_value=50.0), min_size=1, max_size=7),
)
def test_iterations_are_ordered_disjoint_inside_the_window_and_start_at_their_marker(
    head: list[str], loop: list[str], repeats: int, tail: list[str], lengths: list[float]
) -> None:
    names = head + loop * repeats + tail
    spans = plant([(name, lengths[i % len(lengths)]) for i, name in enumerate(names)])
    if not spans:
        return
    window = whole(spans)
    windows, marker = find_iterations(spans, window)
    if not windows:
        assert marker == ""
        return
    starts = {s.ts: s.name for s in spans}
    assert all(window[0] <= a < b <= window[1] for a, b in windows)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(windows, windows[1:]))
    assert all(starts[a] == marker for a, _ in windows)
