"""The job's own collectives weighed as any named cause: a Lightning job that logs four values a step with
``self.log(..., sync_dist=True)`` (recorded: ``tests/data/record_cpu_loops.py``, lightning_sync_dist) runs a barrier and
an all-reduce for each inside training_step, which DDP's forward holds. Before, they read as the model's forward time
and, with communication under a quarter of the step, nothing was said."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.finding_base import share
from orchestrator.analysis.own_collectives import own_collectives
from orchestrator.loops import METADATA_KEY
from tests.support.realtraces import finding
from tests.support.tracefiles import case

SYNC_DIST = "cpu_lightning_sync_dist"


def _without_loop(tmp_path: Path) -> Path:
    """The recording as a trace without the agent's word on whose loop it is."""
    for src in case(SYNC_DIST).rglob("*.json.gz"):
        with gzip.open(src, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        doc.pop(METADATA_KEY)
        out = tmp_path / src.relative_to(case(SYNC_DIST))
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(out, "wt", encoding="utf-8") as f:
            json.dump(doc, f)
    return tmp_path


def test_a_logged_values_barrier_and_all_reduce_inside_forward_are_the_jobs_own() -> None:
    summary = analyze_folder(case(SYNC_DIST))
    for r in summary.ranks:
        assert r.own_comm is not None and r.own_comm.name == "c10d::barrier + c10d::allreduce_"
        assert r.own_comm.calls == 8 * len(r.steps)  # four values: a barrier and an all-reduce each


def test_lightning_logging_with_sync_dist_is_told_to_log_without_it_or_per_epoch() -> None:
    summary = analyze_folder(case(SYNC_DIST))
    assert min(share(r, r.comm_wait_ms) for r in summary.ranks) < 0.25  # under the communication finding's own bar
    first = summary.findings[0]
    assert first.code == "comm_exposed" and first.severity == "warning"
    assert first.title.startswith("The job's own collectives take ") and first.ranks == [0, 1]
    assert "4 barriers a step, each followed by an all-reduce (c10d::barrier + c10d::allreduce_)" in first.fix
    assert "Lightning's self.log(..., sync_dist=True) runs both for each value it logs on the step" in first.fix
    assert "on_step=False, on_epoch=True, reduced once at the epoch's end" in first.fix
    assert "bucket" not in first.fix  # not DDP's gradients


def test_the_same_syncs_in_a_loop_of_its_own_are_told_to_reduce_together(tmp_path: Path) -> None:
    found = finding(analyze_folder(_without_loop(tmp_path)), "comm_exposed")
    assert found.fix.endswith("Reduce the values together (torch.stack them, one all_reduce, no barrier), every N steps rather than every step.")
    assert "Lightning" not in found.fix


def test_an_all_reduce_after_backward_without_ddp_may_be_the_gradients_and_is_left_to_the_communication_bar() -> None:
    # DeepSpeed at ZeRO stage 0 (recorded) reduces the gradients after backward: 18% of the step, no own finding.
    summary = analyze_folder(case("cpu_deepspeed"))
    assert all(r.own_comm is not None for r in summary.ranks)
    assert summary.findings == []


def test_own_collectives_under_a_twentieth_of_the_step_are_not_told() -> None:
    ranks = analyze_folder(case(SYNC_DIST)).ranks
    low = [
        r.model_copy(update={"own_comm": r.own_comm.model_copy(update={"total_ms": 0.04 * (r.mean_step_ms or 0)})})
        for r in ranks if r.own_comm is not None
    ]
    assert own_collectives(low) is None and own_collectives(ranks) is not None

