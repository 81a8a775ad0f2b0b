"""A metric's state gathered from every rank every step (torchmetrics' ``gather_all_tensors``), and who asks for it.

torchmetrics syncs a metric's state across the ranks at each update when it is built with ``dist_sync_on_step=True``
and at each ``compute()``; a loop that computes its metrics every step pays a barrier and all-gathers per state every
step. Who calls ``compute()`` decides the change: the job's own code, or a framework's loop (Composer's Trainer, for
its training metrics).
"""

from __future__ import annotations

from orchestrator.analysis.python_frames import frame_parts
from orchestrator.loops import Loop
from orchestrator.models.analysis import RankSummary

__all__ = ["metric_sync"]

_OWN = (
    "torchmetrics gathers each metric's state from every rank every step (a barrier and all-gathers per state), a "
    "round trip that every rank waits for: a metric built with dist_sync_on_step=True does it at every update, and "
    "compute() at every call. Keep dist_sync_on_step=False (the default) and call compute() once per epoch or every N "
    "steps, where the value is logged: each rank accumulates its own state until then, and the per-step value "
    "metric(preds, target) returns is that rank's own."
)
# Composer 0.32's Trainer updates every training metric (the model's get_metrics(is_train=True)) on each batch and
# computes it after each (Trainer._compute_and_log_metrics). A ComposerClassifier has MulticlassAccuracy unless told
# otherwise; recorded on two gloo ranks, the gathers held 13.1 of 18.0 ms of collective wait and the step took 37.8 ms
# with them, 27.9 ms without (cpu_composer_ddp and its twin).
_COMPOSER_TRAIN_METRICS = (
    "Composer's Trainer computes every training metric after every batch (the metrics the model's "
    "get_metrics(is_train=True) returns; ComposerClassifier's default is MulticlassAccuracy), and each compute() "
    "gathers the metric's state from every rank (a barrier and all-gathers per state), a round trip every rank waits "
    "for. Give the model no training metrics and judge it on its evaluation metrics, which Composer computes only when "
    "it evaluates: ComposerClassifier(..., train_metrics=MetricCollection([])), HuggingFaceModel(..., metrics=None, "
    "eval_metrics=[...]), or a ComposerModel whose get_metrics(is_train=True) returns {}; the loss is still logged "
    "every batch."
)


def metric_sync(r: RankSummary) -> str:
    """What makes the job's own collectives and the change, where torchmetrics' state gathers hold more than half of
    their wait ('' otherwise)."""
    gathered = sum(c.total_ms for c in r.own_comm_callers if (frame_parts(c.name) or ("",))[0].startswith("torchmetrics/"))
    if not 2 * gathered > sum(c.total_ms for c in r.own_comm_callers) > 0:
        return ""
    return _COMPOSER_TRAIN_METRICS if r.loop is Loop.COMPOSER else _OWN
