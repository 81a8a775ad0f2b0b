"""torch.compile compiling inside the steps of a CPU-only trace (orchestrator.analysis.compile_finding).

Recorded by tests/data/record_cpu_compile.py: transformers' Trainer with torch_compile=True, unmodified, batches a new
length each step. Before: "No warning" and one info line on both, while the compiler held 99.8-100% of the compiling
steps (20-32 s against 10-50 ms), counted as forward and backward.
"""

from __future__ import annotations

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.compile_finding import compile_in_steps
from orchestrator.models.analysis import GpuStats
from tests.support.tracefiles import case


def test_a_recompile_in_every_step_is_the_first_finding_with_dynamic_shapes_as_its_fix():
    summary = analyze_folder(case("cpu_compile_recompiles"))
    found = summary.findings[0]
    assert found.code == "compile" and found.severity == "warning" and found.ranks == [0]
    assert found.title.startswith("torch.compile compiles again in 3 of the 3 steps: ")
    assert "torch._dynamo.mark_dynamic(x, 0)" in found.fix and "TORCH_LOGS=recompiles" in found.fix
    assert found.max_saving_fraction > 0.95
    assert all(s.compile_ms > 0.9 * s.duration_ms for s in summary.ranks[0].steps)


def test_one_compiling_step_is_warm_up_an_info_line_with_no_saving():
    summary = analyze_folder(case("cpu_compile_warmup"))
    found = next(f for f in summary.findings if f.code == "compile")
    assert found.severity == "info" and found.max_saving_ms == 0.0
    assert found.title == "torch.compile compiles in 1 of the 3 steps: warm-up"
    assert "steps 1" not in found.evidence and "(step 1)" in found.evidence
    assert "It lifts the mean step to" in found.evidence and "TORCHINDUCTOR_CACHE_DIR" in found.fix
    assert not any(f.severity == "warning" for f in summary.findings)


def test_a_compile_waiting_for_its_own_builds_is_no_other_jobs_cores():
    # Inductor builds in worker processes of its own, which take the cores the training thread waits for. Before: a
    # cores_shared warning led ("reserve cores in Ray, move other jobs off the host"), saving at most 20 s.
    summary = analyze_folder(case("cpu_compile_warmup_contended"))
    assert not any(f.code == "cores_shared" for f in summary.findings)
    assert next(f for f in summary.findings if f.code == "compile").severity == "info"


def test_a_loop_that_compiles_nothing_in_its_steps_is_not_told():
    for name in ("cpu_hf_trainer", "cpu_mlp", "cpu_lightning"):
        assert compile_in_steps(analyze_folder(case(name)).ranks, []) is None


def test_on_a_device_the_compiler_is_the_idle_attributions_not_this_findings():
    # A device trace tells the compiler's time as device idle (advice's compile cause): one finding, not two.
    (rank,) = analyze_folder(case("cpu_compile_recompiles")).ranks
    gpu = GpuStats(
        utilization=0.01, busy_ms_per_step=1.0, idle_ms_per_step=99.0, kernel_ms_per_step=1.0, comm_kernel_ms_per_step=0.0,
        comm_exposed_ms_per_step=0.0, active_span_ms=100.0, active_busy_share=0.01, active_compute_share=0.01,
        comm_overlap=None,
    )
    assert compile_in_steps([rank.model_copy(update={"gpu": gpu})], []) is None
