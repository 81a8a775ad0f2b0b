"""Real traces from other projects (``../shared/external-traces``) and H100 recordings
(``../shared/gpu-traces``), analysed once per test session: several test files ask
about the same trace, and each analysis takes up to 3 s."""

from __future__ import annotations

import functools

from orchestrator.analysis import Summary, analyze_folder
from orchestrator.models.analysis import Finding, RankSummary
from tests.support.tracefiles import shared

# Every external case but the TensorBoard sample "as shipped" (its two files are nw0_a and nw0_b).
EXTERNAL_CASES = (
    "hta_alexnet_no_profilerstep",
    "hta_amd_mi250_minitoy",
    "hta_cpu_only_r34of300",
    "hta_df_index_resolver_v100_r1of2",
    "hta_mtia_single_rank",
    "hta_nccl_parser_a100_r0of2",
    "hta_negative_queue_a100_r0of16",
    "hta_ns_resolution_v100_1rank",
    "hta_trace_diff_control_a100_r3of8",
    "hta_trace_diff_test_v100_r1of2",
    "hta_trace_filter_2of128",
    "param_dlrm_v100_8ranks",
    "param_resnet_no_profilerstep",
    "tbplugin_resnet50_nw0_a",
    "tbplugin_resnet50_nw0_b",
    "tbplugin_resnet50_nw4_a",
    "tbplugin_resnet50_nw4_b",
    "tracelens_mi300_resnet_ckpt_r0of8",
)


@functools.cache
def external(case: str) -> Summary:
    """The analysis of ``../shared/external-traces/<case>/traces``."""
    return analyze_folder(shared("external-traces", case, "traces"))


@functools.cache
def h100(case: str) -> Summary:
    """The analysis of ``../shared/gpu-traces/<case>`` (seed003_before / seed003_after)."""
    return analyze_folder(shared("gpu-traces", case))


def only_rank(summary: Summary) -> RankSummary:
    (rank,) = summary.ranks
    return rank


def finding(summary: Summary, code: str) -> Finding:
    """The finding with ``code``; fails with the codes found when there is none."""
    found = [f for f in summary.findings if f.code == code]
    assert found, f"no {code} finding; found {[f.code for f in summary.findings]}"
    return found[0]


def codes(summary: Summary) -> list[str]:
    return [f.code for f in summary.findings]
