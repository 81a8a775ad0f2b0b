"""Steps that wait in Ray's own code: Ray Train's ``report()`` called too often, and the change for a job that waits
for Ray Data's next batch (:mod:`orchestrator.analysis.untraced` finds both).

``ray.train.report()`` is no logging call. In Ray Train 2 each call first agrees on a checkpoint folder with every
other worker through the run's synchronization actor (a barrier and an actor round trip, checkpoint or not), then
puts the result in a queue of one that Train's controller empties when it polls the workers, every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by default, Ray 2.43-2.60): a loop that reports every step runs one
step per poll. Two gloo workers reporting every step ran 2,028 ms steps of which 2,018 ms were report()
(``tests/data/traces/cpu_train_report``, Ray 2.60). In Ray Train 1 a report hands the result to the trainer and
waits until the driver has taken it.

A job fed by ``get_dataset_shard(...).iter_torch_batches()`` waits in Ray Data's iterator when its pipeline
delivers batches more slowly than the step takes them; the DataLoader's settings are not the change there.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.analysis.finding_base import REPORT_FRACTION, make_finding, ranks_text, share, step_word
from orchestrator.models.analysis import Finding, RankSummary, Straggler

__all__ = ["RAY_DATA_FIX", "train_report"]

RAY_DATA_FIX = (
    "The batches come from Ray Data (get_dataset_shard(...).iter_torch_batches()), whose pipeline delivers them more "
    "slowly than the step takes them: find its slowest operator in the Dataset's stats (ds.stats(), or the Ray "
    "Dashboard's Ray Data view) and give it more parallelism (map_batches(fn, concurrency=N), fewer num_cpus a "
    "task), give the cluster more CPUs for it (Ray Data runs the pipeline's tasks on any node's CPUs: add CPU-only "
    "nodes), or preprocess once ahead of training (write the prepared data out, or ds.materialize() when it fits "
    "in the object store). iter_torch_batches(prefetch_batches=N) (default 1) only hides uneven delivery, not a "
    "slow pipeline."
)
_V2 = (
    "In Ray Train 2 each report() agrees on a checkpoint folder with every worker through the run's "
    "synchronization actor, then waits until Train's controller has taken the previous report, which it polls for "
    "every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default): reports more often than that hold every step to it."
)
_V1 = "In Ray Train 1 each report() hands its result to the trainer and waits until the driver has taken it."


def train_report(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Ray Train's report() takes REPORT_FRACTION of the step or more."""
    hit = [r for r in ranks if r.steps and share(r, _per_step(r)) >= REPORT_FRACTION]
    if not hit:
        return None
    worst = max(hit, key=lambda r: share(r, _per_step(r)))
    per_step = _per_step(worst)
    calls = sum(1 for s in worst.steps if s.report_ms > 0)
    typical = statistics.median(s.report_ms for s in worst.steps if s.report_ms > 0)
    where = (
        f"in every step on rank {worst.rank}, {typical:.1f} ms a step (median)" if calls == len(worst.steps)
        else f"in {calls} of the {len(worst.steps)} steps on rank {worst.rank}, {typical:.1f} ms in those (median; a "
        "wait shorter than the time between two stack samples is caught only now and then, so it may be in more)"
    )
    how = {2: f" {_V2}", 1: f" {_V1}"}.get(worst.ray_train or 0, "")
    return make_finding(
        "train_report",
        worst,
        per_step,
        title=f"ray.train.report() takes {share(worst, per_step):.0%} of the {step_word(worst)}",
        evidence=(
            f"The training thread waits in ray.train.report() {where}, {per_step:.1f} ms of a "
            f"{worst.mean_step_ms or 0:.1f} ms {step_word(worst)} on average, running no op."
            f"{how} Found on {ranks_text(hit)}."
        ),
        fix=(
            "Report every N steps (with the checkpoints, or every few hundred steps) instead of every step, and send "
            "per-step metrics to a logger of their own from rank 0 (TensorBoard, MLflow, W&B)"
            + (", or lower RAY_TRAIN_HEALTH_CHECK_INTERVAL_S in the driver's environment." if worst.ray_train == 2 else ".")
        ),
        ranks=[r.rank for r in hit],
    )


def _per_step(r: RankSummary) -> float:
    return sum(s.report_ms for s in r.steps) / len(r.steps)
