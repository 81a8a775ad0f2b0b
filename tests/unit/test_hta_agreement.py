"""Agreement with Holistic Trace Analysis (HTA), the anchor for multi-rank GPU analysis.

Per rank, over the GPU's active span (HTA's definitions, see
orchestrator/analysis/device.py): the busy share (100% minus HTA's idle time),
the compute share and the share of communication kernel time that computation
overlaps agree with HTA's ``get_temporal_breakdown`` and ``get_comm_comp_overlap``
within 2 percentage points on every external trace HTA can load.

HTA's figures for all of them are in tests/data/hta_reference.json (made by
tests/data/make_hta_reference.py: loading them all with HTA takes minutes);
the small cases are rerun with HTA live, to show the file holds what HTA says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.hta_apart import hta
from tests.support.realtraces import external
from tests.support.tracefiles import shared

TOLERANCE_PP = 2.0
REFERENCE = json.loads((Path(__file__).resolve().parents[1] / "data" / "hta_reference.json").read_text())
LOADED = sorted(case for case, figures in REFERENCE["cases"].items() if "ranks" in figures)
# HTA loads these in seconds: ROCm, a trace without ProfilerStep, and two ranks with collectives.
LIVE = ("hta_amd_mi250_minitoy", "hta_alexnet_no_profilerstep", "hta_trace_filter_2of128")


def ours(case: str) -> dict[str, dict[str, float | None]]:
    """The analysis' figures for ``case`` in HTA's units (percent), by rank."""
    figures = {}
    for rank in external(case).ranks:
        gpu = rank.gpu
        assert gpu is not None, f"{case}: rank {rank.rank} has no device statistics"
        figures[str(rank.rank)] = {
            "idle_time_pctg": 100 * (1 - gpu.active_busy_share),
            "compute_time_pctg": 100 * gpu.active_compute_share,
            "comp_comm_overlap_pctg": None if gpu.comm_overlap is None else 100 * gpu.comm_overlap,
        }
    return figures


def test_hta_loads_most_external_traces_and_its_failures_are_recorded() -> None:
    # tbplugin_resnet50_nw0_as_shipped has two files HTA both reads as rank 0: it keeps one.
    assert len(LOADED) == 17
    failed = {case: figures["error"] for case, figures in REFERENCE["cases"].items() if "error" in figures}
    assert sorted(failed) == ["hta_cpu_only_r34of300", "tracelens_mi300_resnet_ckpt_r0of8"]


@pytest.mark.parametrize("case", LOADED)
def test_gpu_busy_compute_and_overlap_agree_with_hta_within_2_points(case: str) -> None:
    mine = ours(case)
    for rank, theirs in REFERENCE["cases"][case]["ranks"].items():
        for figure, value in theirs.items():
            here = mine[rank][figure]
            if value is None:
                assert here is None, f"{case} rank {rank}: HTA sees no collectives, we do ({figure})"
            else:
                assert here == pytest.approx(value, abs=TOLERANCE_PP), f"{case} rank {rank} {figure}"


@pytest.mark.parametrize("case", LIVE)
def test_the_reference_file_holds_what_hta_says(case: str) -> None:
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (dev extra) is not installed")
    live = hta("figures", shared("external-traces", case, "traces"))
    assert live == REFERENCE["cases"][case]
