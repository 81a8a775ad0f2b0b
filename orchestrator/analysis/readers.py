"""Who reads device values back to the host every step, as the host_sync finding names them.

A read (``loss.item()``, ``.cpu()``, ``if tensor:``) is named by the user's ``record_function`` region that holds
most of them, else by the op that reads by its nature (``x[mask]``, ``if t:``) and by the innermost Python function
of the user's or a library's code around each (:func:`~orchestrator.analysis.python_frames.callers`): a ``with_stack``
trace's frames, else the agent's stack samples taken while it waited (a read long enough to be sampled: on a device,
one that waits for queued work). A library's own reads get the setting that spares them where one is known
(torch.amp.GradScaler's, told from its ops, with stacks or without); without either the fix says how to find the line.
"""

from __future__ import annotations

from orchestrator.analysis.finding_base import runtime_of
from orchestrator.analysis.loop_settings import Change, in_loop
from orchestrator.analysis.precision import half_format
from orchestrator.analysis.python_frames import frame_label, frame_parts
from orchestrator.analysis.spans import READING_OPS, SIZED_BY_DATA, SYNCHRONIZE_CALLS, TENSOR_CONDITIONS, site_parts
from orchestrator.loops import Loop
from orchestrator.models.analysis import RankSummary

__all__ = ["readers", "reading_fix"]

# Library functions that read a device value every step, by (file under site-packages, function), and the change
# that spares the read. transformers' Trainer tests each step's loss with torch.isnan/isinf before it adds it to the
# logged mean (in its training loop: _inner_training_loop in 4.x releases, _run_epoch in 5.24, recorded).
_TRAINER_NAN_FILTER = (
    "transformers' Trainer checks every step's loss for nan/inf before it logs it (TrainingArguments("
    "logging_nan_inf_filter=True), the default; two reads per micro-batch): logging_nan_inf_filter=False removes "
    "them (a nan or inf loss then shows in the logged loss). "
)
# Lightning turns each value logged with prog_bar=True into a Python number each time the trainer collects its
# metrics (once a step with no progress bar shown, three times with one); recorded without prog_bar=True, or with
# on_step=False, a step read nothing.
_LIGHTNING_PROGRESS_BAR = (
    "Lightning turns every value logged with self.log(..., prog_bar=True) into a Python number each step, for the "
    "progress bar (shown or not): log per-step values without prog_bar=True, or with on_step=False (an epoch mean, "
    "read once an epoch). "
)
_LIGHTNING_METRICS = [
    ((f"{package}/trainer/connectors/logger_connector/{module}.py", "metrics"), _LIGHTNING_PROGRESS_BAR)
    for package in ("lightning/pytorch", "pytorch_lightning") for module in ("result", "logger_connector")
]
# Lightning 2.6 broadcasts a SIGTERM flag from rank 0 at the start of every training step and reads it back
# (_TrainingEpochLoop._broadcast_sigterm_tensor, recorded on 2.6.6): on a GPU the read waits for the broadcast and for
# every kernel queued before it. Lightning has no setting that skips it; upstream: issue 21487, PR 21640.
_LIGHTNING_SIGTERM = (
    "Lightning's Trainer broadcasts a SIGTERM flag from rank 0 at the start of every training step and reads it back "
    "(on a GPU the read waits for every kernel queued before it: Lightning-AI/pytorch-lightning issue 21487). No "
    "Trainer setting skips it in Lightning 2.6 (Trainer(broadcast_sigterm_every_n_steps=N) is proposed upstream, "
    "PR 21640); where the job needs no SIGTERM handling across its ranks, "
    "trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None before trainer.fit() removes it (a private "
    "method: check it on upgrades). "
)
# PyTorch Ignite's supervised training step returns output_transform(x, y, y_pred, loss) from every iteration, and its
# default (create_supervised_trainer's, supervised_training_step's and their amp/apex/tpu variants') is loss.item()
# (ignite 0.5.5, recorded with stacks: the read is in the step's update function).
_IGNITE_OUTPUT = (
    "PyTorch Ignite's supervised trainer returns output_transform(x, y, y_pred, loss) from every iteration, and its "
    "default is loss.item(), a read that waits for the step's kernels: pass create_supervised_trainer(..., "
    "output_transform=lambda x, y, y_pred, loss: loss.detach()) and read engine.state.output in a handler every N "
    "iterations (Events.ITERATION_COMPLETED(every=N)); a metric attached per iteration (RunningAverage) turns its "
    "value into a number every iteration too. "
)
# MosaicML Composer's Trainer reads seven values back a batch itself (Composer 0.32.1, recorded with stacks; read in its
# source): the results of five small collectives, in four of its functions, and the loss its optimizer closure returns
# (.item(): it steps the optimizer with a closure unless the precision is amp_fp16). None is behind a setting.
_COMPOSER_READS = (
    "Composer's Trainer reads seven values back every batch itself: the results of five small collectives (whether "
    "any rank's data ran out, the batch's size, the loss, the samples and tokens seen, rank 0's batch time) and the "
    "loss its optimizer closure returns. No Trainer setting skips them (Composer 0.32); on a GPU the closure's read "
    "waits for forward and backward, the loss's after the step for the optimizer's update, the others only for their "
    "own collective. Any other reads are the job's own. "
)
# OpenMMLab's MMEngine puts every value the model's train_step returns (each loss term, and the sum parse_losses adds)
# into its MessageHub after each iteration (RuntimeInfoHook.after_train_iter), which turns each into a Python number
# (MMEngine 0.10.7, recorded with stacks: three reads for two terms).
_MMENGINE_READS = (
    "MMEngine's RuntimeInfoHook turns every value the model's train_step returns (each loss term of its loss() and "
    "the sum parse_losses adds) into a Python number after each iteration, for its MessageHub: no setting skips them "
    "(MMEngine 0.10); on a GPU the first waits for the step's kernels and the rest cost one read each, so a term "
    "returned only to be logged can be left out, or summed into another. "
)
# skorch's NeuralNet records each batch's loss in its history as a number (run_single_epoch: step["loss"].item(), skorch
# 1.4.0, recorded with stacks).
_SKORCH_HISTORY = (
    "skorch's NeuralNet records every batch's loss in net.history as a Python number (its run_single_epoch, one read "
    "a batch, after the optimizer step is queued): no setting skips it (skorch 1.4). "
)
_KNOWN = {
    ("ignite/engine/__init__.py", "update"): _IGNITE_OUTPUT,
    **{("composer/trainer/trainer.py", function): _COMPOSER_READS
       for function in (
           "_iter_dataloader", "_train_microbatches", "_train_loop", "<dictcomp>", "<lambda>", "_accumulate_time_across_ranks",
       )},
    ("mmengine/hooks/runtime_info_hook.py", "after_train_iter"): _MMENGINE_READS,
    ("skorch/net.py", "run_single_epoch"): _SKORCH_HISTORY,
    **{("mmengine/logging/message_hub.py", function): _MMENGINE_READS
       for function in ("update_scalar", "update_scalars", "_get_valid_value")},
    ("transformers/trainer.py", "_run_epoch"): _TRAINER_NAN_FILTER,
    ("transformers/trainer.py", "_inner_training_loop"): _TRAINER_NAN_FILTER,
    **dict(_LIGHTNING_METRICS),
    **{(f"{package}/loops/training_epoch_loop.py", "_broadcast_sigterm_tensor"): _LIGHTNING_SIGTERM
       for package in ("lightning/pytorch", "pytorch_lightning")},
}


def _known(name: str) -> str:
    """A library's known setting for the reads of the frame ``name`` ('' for none). The agent's stack samples name a
    method with its class (``Trainer._run_epoch``), a with_stack trace without it."""
    parts = frame_parts(name)
    return _KNOWN.get((parts[0], parts[1].rsplit(".", 1)[-1]), "") if parts else ""


def readers(r: RankSummary) -> str:
    """The Python functions that make the reads (a with_stack trace's, else the stack samples'), with how often:
    "f (a.py:3) 2 a step, ..."."""
    steps = max(len(r.steps), 1)
    return ", ".join(
        f"{frame_label(c.name, 90)} " + (f"{c.calls / steps:.0f} a step" if c.calls >= steps else f"{c.calls} in {steps} steps")
        for c in r.sync_callers[:3]
    )


def _value_reads_text(r: RankSummary) -> str:
    return (
        "Keep loss.item(), .cpu(), .tolist() and printing tensors off the per-step path: accumulate the loss on the "
        "device and read it every N steps, or copy it with non_blocking=True into a pinned buffer and read it after "
        f"{runtime_of(r.device).event} has completed. Pinning memory does not help here: the wait is for the kernels "
        "queued before the read."
    )


def _value_reads(r: RankSummary) -> str:
    """The advice for reading values back, and the setting of ``r``'s loop that reads them less often."""
    return _value_reads_text(r) + in_loop(r.loop, [Change.LOG_LESS_OFTEN])


def reading_fix(r: RankSummary) -> str:
    """The fix: who makes most of the reads and what to change there, or how to find out; then the advice for reading
    values back (item(), .cpu()), unless every read is one of those named (GradScaler's, an op's, a synchronize)."""
    if region := _region(r):
        return region + _value_reads(r)
    scaler = _grad_scaler(r)
    if scaler and sum(c.calls for c in r.sync_ops) <= len(r.steps):
        return scaler.rstrip()  # one read a step: the scaler's
    where, known = _function(r)
    if known:  # a library's own reads, and the setting that spares them: the most direct change, first
        said = scaler + where + known + _ops(r)
    elif where:
        said = scaler + _ops(r) + where + "start there. "
    else:
        # Where ops that read by their nature make every read, name them however rarely they read: nothing else
        # would be said (a rare one beside item() reads would lead the fix instead of them).
        ops = _ops(r) or (_ops(r, every_step=False) if _all_named(r) else "")
        said = scaler + ops + ("" if r.sync_callers else "To see which Python line reads, profile with with_stack=True. ")
    if said and _all_named(r):
        return said.rstrip()
    return said + _value_reads(r)


def _all_named(r: RankSummary) -> bool:
    """Every read is made by an op that reads by its nature or by a synchronize (none is an item() or .cpu())."""
    return all(site_parts(o.name)[1] in READING_OPS | SYNCHRONIZE_CALLS for o in r.sync_ops)


def _ops(r: RankSummary, *, every_step: bool = True) -> str:
    """The reads that ops make by their nature, at least one a step unless not ``every_step``: what to write instead
    ('' when none does)."""
    steps = max(len(r.steps), 1)
    by_op: dict[str, int] = {}
    for o in r.sync_ops:
        op = site_parts(o.name)[1]
        by_op[op] = by_op.get(op, 0) + o.calls

    def listed(ops: frozenset[str]) -> str:
        return ", ".join(
            f"{op} ({how_often(n, steps)})"
            for op, n in by_op.items()
            if op in ops and (n >= steps or not every_step)
        )

    said = ""
    if sized := listed(SIZED_BY_DATA):
        said += (
            f"{sized}: ops that size their output from the data read a count back first; keep shapes static "
            "(torch.where(mask, x, 0) or x * mask in place of x[mask] and masked_select; nonzero_static(size=...), "
            "repeat_interleave(output_size=...), one_hot(num_classes=...) where the size is known). "
        )
    if synchronize := listed(SYNCHRONIZE_CALLS):
        said += (
            f"{synchronize}: the loop waits for the device itself ({runtime_of(r.device).module}.synchronize(), a "
            "stream's or event's .synchronize()), most often left from timing code: drop it, or time with "
            f"{runtime_of(r.device).name} events read every N steps. "
        )
    if conditions := listed(TENSOR_CONDITIONS):
        said += (
            f"{conditions}: a tensor turned into a Python bool (if t:, while t:, assert t, torch.equal) waits for it; "
            "decide on the device (torch.where) or check every N steps. "
        )
    return said


# Optimizers whose fused step takes GradScaler's found_inf on the device (_step_supports_amp_scaling).
_AMP_FUSED = ("Adam", "AdamW", "SGD", "Adagrad")


def _grad_scaler(r: RankSummary) -> str:
    """GradScaler's own read ('' when the job has no scaler, or a fused optimizer that spares it): scaler.step reads
    found_inf (once per device) to decide whether to skip the step, unless the optimizer's fused kernel takes it."""
    if not r.grad_scaler or r.optimizer_impl in ("fused", None):
        return ""
    classes = [c for c in r.optimizers if c in _AMP_FUSED]
    fused = (
        f"fused=True on {' and '.join(classes)}" if classes and len(classes) == len(r.optimizers)
        else "a fused optimizer (fused=True on Adam, AdamW, SGD)"
    )
    return (
        "torch.amp.GradScaler reads found_inf back once a step (scaler.step) to decide whether to skip the optimizer "
        f"step: with {fused} the scaler hands it to the fused kernel and the read goes"
        + ("; bf16 autocast needs no scaler at all. " if half_format(r.accelerator) == "bf16" else ". ")
    )


def _region(r: RankSummary) -> str:
    """The user's record_function region that holds most of the reads ('' when none does)."""
    by_region: dict[str, int] = {}
    for op in r.sync_ops:
        region, rest = site_parts(op.name)
        if region and rest and not region.startswith("Optimizer."):
            by_region[region] = by_region.get(region, 0) + op.calls
    if not by_region:
        return ""
    region, calls = max(by_region.items(), key=lambda kv: (kv[1], kv[0]))
    if 2 * calls < sum(op.calls for op in r.sync_ops):
        return ""
    return (
        f"The region {region!r} reads tensor values back to the host {how_often(calls, len(r.steps))}: compute "
        "what it needs on the device (boolean masks, torch.where, torch.nonzero on the device tensor) instead. "
    )


def how_often(calls: int, steps: int) -> str:
    """'2x per step', or '1 in 3 steps' for reads fewer than most steps hold (never '0x per step'). A read after the
    step's boundary (a loop's loss.item() after optimizer.step()) falls in all but one of a window's steps: 2 in 3
    steps rounds to once a step."""
    steps = max(steps, 1)
    return f"{max(1, round(calls / steps))}x per step" if calls / steps >= 0.6 else f"{calls} in {steps} steps"


def _conditions_per_step(r: RankSummary) -> float:
    """Tensors turned into Python bools per step (``if t:``, ``torch.isnan(x) or ...``)."""
    return sum(o.calls for o in r.sync_ops if site_parts(o.name)[1] in TENSOR_CONDITIONS) / max(len(r.steps), 1)


def _function(r: RankSummary) -> tuple[str, str]:
    """The Python function whose reads hold more than half of the waiting (on a CPU, of the reads), and a library's
    known setting for them ('' for either when there is none, or the trace has no Python stacks)."""
    # On a device the first read after queued work waits longest; on a CPU no read waits, so the most frequent leads.
    weight = (lambda c: c.total_ms) if r.gpu is not None else (lambda c: float(c.calls))
    top = max(r.sync_callers, key=weight, default=None)
    if top is None and r.loop is Loop.TRANSFORMERS_TRAINER and _conditions_per_step(r) >= 2:
        # No stacks, but the agent's word that the Trainer runs the loop: it makes two such reads a micro-batch itself.
        return "", _TRAINER_NAN_FILTER
    if top is None:
        return "", ""
    total = sum(weight(c) for c in r.sync_callers)
    if 2 * weight(top) > total:
        where = f"The reads are mostly in {frame_label(top.name)} ({how_often(top.calls, len(r.steps))}): "
        return where, _known(top.name)
    # A library's own reads spread over several of its functions (Composer's, in five): its word, where they hold
    # more than half.
    by_known: dict[str, float] = {}
    for c in r.sync_callers:
        if known := _known(c.name):
            by_known[known] = by_known.get(known, 0.0) + weight(c)
    known, held = max(by_known.items(), key=lambda kv: kv[1], default=("", 0.0))
    return "", known if 2 * held > total else ""
