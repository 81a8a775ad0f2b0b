"""Activation checkpointing's recomputation: forward's ops that backward runs again, told as the trade it is.

``torch.utils.checkpoint`` (transformers' ``gradient_checkpointing=True``, torchtitan's and Megatron's activation
checkpointing) keeps a block's inputs instead of its activations and runs the block's forward again when backward
needs them: inside an autograd node (a ``CheckpointFunctionBackward`` node with ``use_reentrant=True``; the node
that first unpacks a saved tensor without it). A trace shows the recomputation as forward's own ops inside
``autograd::engine::evaluate_function: ...`` spans: ``aten::linear``, ``aten::conv2d``, ``aten::layer_norm``,
``aten::scaled_dot_product_attention``..., which no derivative formula calls (their gradients are
``aten::mm``, ``aten::convolution_backward``, ``aten::native_layer_norm_backward``...). Elementwise ops between them
(an activation, a residual add) are recomputed too but are also what formulas call, so the time measured is of the
named ops: a part of the recomputation.

Whether it is worth its time depends on memory the trace may not show, so the finding is an info line that claims
no saving: it names the recomputation's time (host, and on a device its kernels'), the memory peak where the trace
has one, and how to recompute less where memory allows. The TensorBoard-era traces rayprof reads without it would
otherwise show only a backward three times forward's. Real cases: TraceLens' MI300 ResNet under activation
checkpointing (``../shared/external-traces/tracelens_mi300_resnet_ckpt_r0of8``: conv2d and batch_norm, 57 of each,
inside backward) and transformers' Trainer with ``gradient_checkpointing=True``
(``tests/data/traces/cpu_hf_trainer_checkpointing``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from orchestrator.analysis.autograd_nodes import Nodes
from orchestrator.analysis.device import DeviceView
from orchestrator.analysis.finding_base import make_finding, ranks_text, step_word
from orchestrator.analysis.intervals import Intervals, clip, total, union
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.spans import Kinds
from orchestrator.models.analysis import Finding, RankSummary, Straggler
from orchestrator.models.recompute import Recompute

__all__ = ["RECOMPUTED_OPS", "activation_recompute", "recompute_of"]

# Forward's ops that no derivative formula calls: inside an autograd node, they are forward run again.
RECOMPUTED_OPS = frozenset({
    "aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::layer_norm", "aten::group_norm",
    "aten::batch_norm", "aten::rms_norm", "aten::embedding", "aten::scaled_dot_product_attention",
})


def recompute_of(
    threads: Mapping[object, Kinds], windows: Sequence[tuple[float, float]], dev: DeviceView | None,
    launches: Mapping[int, tuple[float, float, object]],
) -> Recompute | None:
    """The recomputed ops of one process's ``threads`` (each thread's spans by kind) in each window, and on a device
    trace their kernels' time; None where backward recomputes none of them."""
    inside: dict[object, Intervals] = {}
    calls: dict[str, int] = {}
    for key, kinds in threads.items():
        ops = [(name, s) for (name, cat), group in kinds.items() if name in RECOMPUTED_OPS and cat == "cpu_op" for s in group]
        if not ops:
            continue  # the common case: a thread that runs none (the autograd thread of a GPU job runs no forward)
        nodes = Nodes(kinds)
        held = [(name, s) for name, s in ops if nodes.holding(s) is not None] if nodes.spans else []
        for name, _ in held:
            calls[name] = calls.get(name, 0) + 1
        if held:
            inside[key] = union((s.ts, s.end) for _, s in held)
    if not inside or not windows:
        return None
    merged = union(iv for ivs in inside.values() for iv in ivs)
    return Recompute(
        ops={name: n / len(windows) for name, n in sorted(calls.items(), key=lambda kv: -kv[1])},
        host_ms=[total(clip(merged, t0, t1)) / 1000 for t0, t1 in windows],
        device_ms=dev.kernel_ms_launched_in(windows, inside, launches) if dev is not None else None,
    )


def activation_recompute(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Backward recomputes forward's ops on some rank: an info line with the time it takes, no saving claimed."""
    hit = [r for r in ranks if r.recompute is not None and r.steps]
    if not hit:
        return None

    def cost(rec: Recompute) -> float:
        return statistics.fmean(rec.device_ms if rec.device_ms is not None else rec.host_ms)

    worst, rec = max(((r, r.recompute) for r in hit if r.recompute is not None), key=lambda pair: cost(pair[1]))
    host = statistics.fmean(rec.host_ms)
    device = f", their kernels {statistics.fmean(rec.device_ms):.1f} ms of device time" if rec.device_ms is not None else ""
    peaks = [m for m in worst.memory if m.capacity_bytes]
    memory = (
        f" Memory peaks at {max(m.peak_bytes / m.capacity_bytes for m in peaks):.0%} of the device's in this window."
        if peaks else " This trace does not say how much memory the activations would take (profile_memory does)."
    )
    ops = ", ".join(f"{name} ×{n:.0f}" for name, n in list(rec.ops.items())[:4])
    return make_finding(
        "activation_recompute",
        worst,
        0.0,
        severity="info",
        title=f"Activation checkpointing runs forward's ops again in backward: {host:.1f} ms a {step_word(worst)}",
        evidence=(
            f"Backward recomputes forward's ops on {ranks_text(hit)}: {ops} a {step_word(worst)} inside autograd nodes "
            f"(torch.utils.checkpoint's recomputation), {host:.1f} ms of host time of the {worst.mean_step_ms or 0:.1f} ms "
            f"{step_word(worst)} on rank {worst.rank}{device}, besides the elementwise ops between them. It is the price "
            f"of the activations it does not keep.{memory}"
        ),
        fix=(
            "Where memory allows, recompute less: checkpoint fewer blocks (every other one), or selectively "
            "(torch.utils.checkpoint with create_selective_checkpoint_contexts keeps the matrix multiplies' outputs "
            "and recomputes the cheap ops), or not at all."
            + in_loop(worst.loop, [Change.NO_CHECKPOINT_ACTIVATIONS])
        ),
        ranks=[r.rank for r in hit],
    )
