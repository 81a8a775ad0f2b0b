"""Activation checkpointing's recomputation, forward's ops that backward runs again, told as the trade it is
(orchestrator.analysis.recompute): an info line that claims no saving, with the recomputation's time and how to
recompute less. Before, both real cases were silent about it: transformers' Trainer with gradient_checkpointing=True
(cpu_hf_trainer_checkpointing, recorded by tests/data/record_cpu_issue29.py) and TraceLens' MI300 ResNet under
activation checkpointing (../shared/external-traces/tracelens_mi300_resnet_ckpt_r0of8)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.autograd_nodes import NODE_PREFIX, Nodes
from orchestrator.analysis.recompute import recompute_of
from orchestrator.analysis.spans import by_kind
from orchestrator.traces.loader import Span
from tests.support.realtraces import external, finding
from tests.support.tracefiles import case


def test_transformers_gradient_checkpointing_is_told_with_the_trainers_setting():
    summary = analyze_folder(case("cpu_hf_trainer_checkpointing"))
    found = finding(summary, "activation_recompute")
    assert found.severity == "info" and found.max_saving_ms == 0
    assert found.evidence.startswith(
        "Backward recomputes forward's ops on rank 0: aten::layer_norm ×4, aten::scaled_dot_product_attention ×2 a step"
    )
    assert found.fix.endswith("In transformers' Trainer: TrainingArguments(gradient_checkpointing=False), its default.")
    (rank,) = summary.ranks
    assert rank.recompute is not None and all(0 < ms < s.phases.backward for ms, s in zip(rank.recompute.host_ms, rank.steps))


def test_the_same_trainer_without_checkpointing_recomputes_nothing():
    summary = analyze_folder(case("cpu_hf_trainer"))
    assert all(r.recompute is None for r in summary.ranks)
    assert "activation_recompute" not in [f.code for f in summary.findings]


def test_tracelens_mi300_resnet_under_checkpointing_names_its_convolutions_and_their_kernels():
    summary = external("tracelens_mi300_resnet_ckpt_r0of8")
    found = finding(summary, "activation_recompute")
    assert "aten::conv2d ×19, aten::batch_norm ×19 a step" in found.evidence
    (rank,) = summary.ranks
    assert rank.recompute is not None and rank.recompute.device_ms is not None
    assert all(ms > 0 for ms in rank.recompute.device_ms)
    # Its lead finding stays the exposed collectives: a trade with no saving claimed does not rank above a cause.
    assert summary.findings[0].code == "comm_exposed"


def _node(name: str, ts: float, dur: float) -> Span:
    return Span(ts, ts + dur, f"{NODE_PREFIX}{name}", "cpu_op", 1, 1)


def test_a_derivative_formulas_own_ops_are_not_a_recomputation():
    spans = [
        Span(0, 100, "aten::linear", "cpu_op", 1, 1),  # forward's
        _node("AddmmBackward0", 200, 100), Span(210, 250, "aten::mm", "cpu_op", 1, 1),  # the formula's
        _node("NativeLayerNormBackward0", 300, 200), Span(310, 400, "aten::linear", "cpu_op", 1, 1),  # forward again
    ]
    found = recompute_of({"t": by_kind(spans)}, [(0.0, 1000.0)], None, {})
    assert found is not None and found.ops == {"aten::linear": 1} and found.host_ms == [0.09]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 500), st.integers(0, 200)), max_size=30), st.integers(0, 700), st.integers(0, 100))
def test_the_node_holding_a_span_is_the_innermost_that_contains_it(raw, ts, dur):
    spans = [_node("X", float(a), float(d)) if is_node else Span(float(a), float(a + d), "aten::add", "cpu_op", 1, 1) for is_node, a, d in raw]
    span = Span(float(ts), float(ts + dur), "aten::linear", "cpu_op", 1, 1)
    nodes = Nodes(by_kind(spans))
    holding = [n for n in nodes.spans if n.ts <= span.ts and span.end <= n.end]
    expected = max(holding, key=lambda n: (n.ts, nodes.spans.index(n)), default=None)
    assert nodes.holding(span) == expected
