"""Which host collective launched a collective kernel: the innermost collective call around the launch, on the
launching thread, that names a collective (a property against a brute-force reading, on nestings of any shape)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis.collectives import launched_by
from orchestrator.analysis.spans import by_kind, collective_of, is_comm
from orchestrator.traces.loader import Span

HOST_OPS = ["c10d::allreduce_", "record_param_comms", "nccl:all_to_all", "c10d::_allgather_base_", "FSDP::reduce_scatter", "aten::add"]
MAIN, AUTOGRAD = (1, 1), (1, 2)


def _kernel(corr: int) -> Span:
    return Span(1000.0 + corr, 1001.0 + corr, "ncclDevKernel_Generic(x)", "kernel", 0, 7, correlation=corr)


def _host(ts: float, dur: float, name: str, thread: tuple[int, int] = MAIN) -> Span:
    return Span(ts, ts + dur, name, "cpu_op", *thread)


def test_the_innermost_call_that_names_a_collective_names_the_kernel() -> None:
    host = [_host(0, 100, "c10d::alltoall_base_"), _host(10, 50, "record_param_comms"), _host(20, 10, "nccl:all_to_all")]
    named = launched_by([_kernel(1)], {1: (25.0, 27.0, MAIN)}, {MAIN: by_kind(host)})
    assert named == {1: "all_to_all"}


def test_a_launch_on_another_thread_is_named_by_that_threads_calls_not_the_main_threads() -> None:
    kinds = {MAIN: by_kind([_host(0, 100, "c10d::broadcast_")]), AUTOGRAD: by_kind([_host(0, 100, "c10d::allreduce_", AUTOGRAD)])}
    assert launched_by([_kernel(1)], {1: (50.0, 52.0, AUTOGRAD)}, kinds) == {1: "all_reduce"}


def test_a_launch_outside_every_collective_call_or_without_a_recorded_launch_is_left_unnamed() -> None:
    kinds = {MAIN: by_kind([_host(0, 10, "c10d::allreduce_"), _host(5, 2, "record_param_comms")])}
    assert launched_by([_kernel(1), _kernel(2)], {1: (20.0, 21.0, MAIN)}, kinds) == {}


def test_a_call_that_names_no_collective_does_not_hide_the_one_around_it() -> None:
    host = [_host(0, 100, "c10d::allreduce_"), _host(10, 50, "record_param_comms")]
    assert launched_by([_kernel(1)], {1: (20.0, 21.0, MAIN)}, {MAIN: by_kind(host)}) == {1: "all_reduce"}


_spans = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 200), st.sampled_from(HOST_OPS)), max_size=25
).map(lambda rows: [_host(float(ts), float(dur), name) for ts, dur, name in rows])


@given(_spans, st.lists(st.integers(0, 600), max_size=10))
def test_any_nesting_names_each_launch_by_its_latest_starting_naming_call(host: list[Span], ats: list[int]) -> None:
    launches = {i: (float(at), float(at) + 1, MAIN) for i, at in enumerate(ats)}
    named = launched_by([_kernel(i) for i in launches], launches, {MAIN: by_kind(host)})
    for i, (at, _, _) in launches.items():
        around = [s for s in host if s.ts <= at <= s.end and is_comm(s) and collective_of(s.name) != "other"]
        latest = max((s.ts for s in around), default=None)
        expected = {collective_of(s.name) for s in around if s.ts == latest}
        assert (named.get(i) in expected) if expected else i not in named
