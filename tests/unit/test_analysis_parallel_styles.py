"""torch.distributed's own parallel styles, recorded unmodified on two gloo ranks (``tests/data/record_cpu_parallel.py``):
DTensor tensor parallelism, whose functional collectives and their ``wait_tensor`` read before as forward and backward
time (comm 9.3 ms of a 388 ms step where the host waited 36 ms in wait_tensor alone), and ZeroRedundancyOptimizer,
whose broadcast of the updated shards after its step was told DDP's bucket settings or BatchNorm's buffers."""

from __future__ import annotations

import gzip
import json

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.comm_fix import comm_fix
from orchestrator.analysis.spans import is_functional
from orchestrator.models.analysis import OpStat, RankSummary
from tests.support.realtraces import finding
from tests.support.tracefiles import case

TENSOR_PARALLEL = "cpu_tensor_parallel"
ZERO_REDUNDANCY = "cpu_zero_redundancy"


def _wait_tensor_ms_per_step(rank: int, steps: int) -> float:
    """The host's time in _c10d_functional::wait_tensor over the recorded steps (2-4), per step, read from the file."""
    path = case(TENSOR_PARALLEL) / "traces" / f"rank{rank}.pt.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sum(e["dur"] for e in events if e.get("name") == "_c10d_functional::wait_tensor") / 1000 / steps


def test_functional_collectives_and_their_waits_are_communication() -> None:
    for r in analyze_folder(case(TENSOR_PARALLEL)).ranks:
        names = {op.name for op in r.comm_ops}
        assert {"_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"} <= names
        assert r.mean_phases.comm >= 0.99 * _wait_tensor_ms_per_step(r.rank, len(r.steps))


def test_older_and_autograd_functional_collectives_are_named_so() -> None:
    for name in ("_c10d_functional::all_reduce", "c10d_functional::wait_tensor", "_c10d_functional_autograd::all_to_all_single"):
        assert is_functional(name)
    assert not is_functional("c10d::allreduce_")


def test_tensor_parallels_all_reduces_are_not_the_jobs_own() -> None:
    # They run between the forward's ops with no marker around them: before, they read as a metric reduced every step.
    assert [r.own_comm for r in analyze_folder(case(TENSOR_PARALLEL)).ranks] == [None, None]


def test_tensor_parallel_on_a_cpu_is_told_that_nothing_overlaps_its_all_reduces() -> None:
    found = finding(analyze_folder(case(TENSOR_PARALLEL)), "comm_exposed")
    assert found.fix.startswith("The all-reduces are tensor parallelism's (DTensor's functional collectives")
    assert "On a CPU (gloo) nothing overlaps them, and each is a round trip its layer waits for" in found.fix
    assert "more rows per step (a larger batch, longer sequences)" in found.fix
    assert "bucket" not in found.fix and "use DDP/FSDP rather than" not in found.fix


def test_tensor_parallel_on_a_gpu_is_told_its_node_sequence_parallelism_and_async_tensor_parallelism() -> None:
    rank = analyze_folder(case(TENSOR_PARALLEL)).ranks[0].model_copy(update={"device": "cuda"})
    fix = comm_fix(rank)
    assert "inside one node (NVLink)" in fix and "torch._inductor.config._micro_pipeline_tp = True" in fix
    assert "On a CPU" not in fix


def test_a_compiled_ddp_models_functional_all_reduce_stays_ddps() -> None:
    rank = analyze_folder(case(TENSOR_PARALLEL)).ranks[0].model_copy(update={"ddp": True})
    assert "tensor parallelism" not in comm_fix(rank)


def test_zero_redundancy_optimizers_broadcasts_are_the_optimizers_own_collectives() -> None:
    for r in analyze_folder(case(ZERO_REDUNDANCY)).ranks:
        assert r.optimizer_comm is not None and r.optimizer_comm.name == "c10d::broadcast_"
        assert r.optimizer_comm.calls == 14 * len(r.steps)  # one per parameter: seven Linear layers
        assert 0 < r.optimizer_comm.total_ms < r.comm_wait_ms


def test_zero_redundancy_on_a_cpu_is_told_its_bucket_view_and_the_rest_ddps_settings() -> None:
    found = finding(analyze_folder(case(ZERO_REDUNDANCY)), "comm_exposed")
    assert found.fix.startswith("ZeroRedundancyOptimizer broadcasts each rank's updated shard of the parameters")
    assert "14 collective calls a step (c10d::broadcast_)" in found.fix
    assert "With parameters_as_bucket_view=True each rank's shard goes as one broadcast" in found.fix
    assert "overlap_with_ddp" not in found.fix  # gloo refuses it: "Overlapping DDP with ZeRO may meet hangs"
    other = found.fix.split(" The other ", 1)[1]
    assert "DDP already all-reduces the gradients in buckets during backward" in other
    assert "BatchNorm" not in found.fix  # not DDP's buffers: before, the broadcast read as theirs


def test_zero_redundancy_on_a_gpu_is_told_to_overlap_its_step_with_ddps_backward() -> None:
    rank = analyze_folder(case(ZERO_REDUNDANCY)).ranks[1].model_copy(update={"device": "cuda"})
    fix = comm_fix(rank)
    assert "overlap_with_ddp=True" in fix and "hook_with_zero_step(allreduce_hook, ddp_model, zero)" in fix


def _with_optimizer_comm(r: RankSummary, fraction: float, optimizers: list[str]) -> RankSummary:
    made = OpStat(name="c10d::_allgather_base_", calls=len(r.steps), total_ms=fraction * r.comm_wait_ms)
    return r.model_copy(update={"optimizer_comm": made, "optimizers": optimizers})


def test_another_optimizers_collectives_are_told_as_its_own_exchange() -> None:
    rank = _with_optimizer_comm(analyze_folder(case(ZERO_REDUNDANCY)).ranks[1], 0.9, ["Shampoo"])
    fix = comm_fix(rank)
    assert fix.startswith("Shampoo.step makes collectives of its own after backward")
    assert "an unsharded optimizer, which makes none" in fix and " The other " not in fix  # the rest is a tenth


def test_an_optimizers_collectives_under_a_third_of_the_wait_leave_the_fix_to_the_rest() -> None:
    rank = _with_optimizer_comm(analyze_folder(case(ZERO_REDUNDANCY)).ranks[1], 0.3, ["ZeroRedundancyOptimizer"])
    assert comm_fix(rank).startswith("DDP already all-reduces the gradients")


def test_a_closure_optimizers_ddp_buckets_are_not_its_own_collectives() -> None:
    # Lightning under DDP: the closure's backward, inside Optimizer.step, launches and waits for DDP's buckets.
    assert [r.optimizer_comm for r in analyze_folder(case("cpu_lightning_ddp")).ranks] == [None, None]


def test_fsdp2s_norm_all_reduced_through_dtensor_is_not_tensor_parallelism() -> None:
    # clip_grad_norm_ on FSDP2's sharded gradients: one functional all-reduce a step beside FSDP's own regions.
    summary = analyze_folder(case("cpu_fsdp2_clip"))
    for r in summary.ranks:
        assert "_c10d_functional::all_reduce" in {op.name for op in r.comm_ops} and r.own_comm is None
    fix = finding(summary, "comm_exposed").fix
    assert fix.startswith("FSDP's collectives do not overlap compute") and "tensor parallelism" not in fix


def test_a_functional_all_reduce_beside_longer_collectives_is_not_tensor_parallelism() -> None:
    # As FSDP2's norm beside FSDP's regions, where those hold under half of the wait and FSDP's fix does not take it.
    rank = analyze_folder(case(TENSOR_PARALLEL)).ranks[0]
    gloo = OpStat(name="c10d::allreduce_", calls=3, total_ms=10 * sum(op.total_ms for op in rank.comm_ops))
    assert "tensor parallelism" not in comm_fix(rank.model_copy(update={"comm_ops": [*rank.comm_ops, gloo]}))
