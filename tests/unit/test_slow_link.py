"""A slow link, localised to its process group: collective time per group from real kernels, judged against peers."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.culprit import RealStep, Template, build_mesh_set, build_set, named_culprits
from orchestrator.analysis import analyze_folder
from orchestrator.analysis.findings import find_all
from orchestrator.analysis.groups import slow_groups
from orchestrator.traces.loader import comm_group, parse_group_ranks

EXTERNAL = Path(__file__).resolve().parents[3] / "shared" / "external-traces"
needs_traces = pytest.mark.skipif(not EXTERNAL.is_dir(), reason="../shared/external-traces is not beside the clone")

# One real step of PARAM's DLRM on V100 (rank 2 of 8, as rayprof breaks it down), and its all-reduce's transfer.
DLRM = Template(
    "dlrm",
    [RealStep(busy={"data": 1.3, "forward": 4.8, "backward": 4.4, "optimizer": 1.4, "memcpy": 0.2, "sync": 0.4,
                    "other": 0.1}, transfer_ms=1.9)],
    median_step_ms=14.5,
)


@needs_traces
def test_each_collective_kernel_is_counted_in_the_process_group_the_trace_names(tmp_path):
    shutil.copytree(EXTERNAL / "hta_nccl_parser_a100_r0of2", tmp_path / "t")
    rank = analyze_folder(tmp_path / "t").ranks[0]
    [group] = rank.process_groups
    assert (group.name, group.description, group.size, group.calls_per_step) == ("0", "default_pg", 2, 7.0)
    assert group.elements_per_step > 0
    for step in rank.steps:
        # One group, one stream: its kernels' time is the step's collective kernel time.
        assert step.group_comm_ms["0"] == pytest.approx(step.comm_kernel_ms, rel=1e-6)


@pytest.mark.parametrize("fault, slow", [("slow_link_tp", "tp"), ("slow_link_dp", "dp")])
def test_a_slow_link_is_named_as_its_group_and_no_rank_is_blamed(fault, slow):
    for seed in range(3):
        ranks, planted, group = build_mesh_set(DLRM, 64, fault, 0.2, random.Random(f"{fault}/{seed}"))
        found = slow_groups(ranks)
        assert [g.name for g in found] == [group] and group.startswith(slow)
        assert named_culprits(ranks) == {} and planted == set()


def test_the_slow_link_finding_names_the_groups_ranks_hosts_and_the_links_to_test():
    ranks, _, group = build_mesh_set(DLRM, 32, "slow_link_tp", 0.3, random.Random(4))
    [finding] = [f for f in find_all(ranks, []) if f.code == "slow_link"]
    members = [r.rank for r in ranks if any(g.name == group for g in r.process_groups)]
    assert finding.ranks == members and len(members) == 8
    assert f"ranks {members[0]}-{members[-1]} on node{members[0] // 8}" in finding.evidence
    assert "no rank is late" in finding.evidence and "all_reduce_perf" in finding.fix
    assert finding.severity == "warning" and finding.max_saving_ms > 0.2 * DLRM.median_step_ms


@pytest.mark.parametrize("fault", ["slow_link_tp", "slow_link_dp"])
def test_the_wait_a_slow_link_adds_is_not_told_to_overlap_communication(fault):
    # Every rank waits out the slow group in lockstep; overlapping collectives with compute does not remove that.
    for seed in range(3):
        ranks, _, _ = build_mesh_set(DLRM, 32, fault, 0.3, random.Random(f"overlap/{seed}"))
        assert [f.code for f in find_all(ranks, [])] == ["slow_link"]


def test_a_straggler_is_named_and_neither_its_groups_nor_the_peers_it_held_back_are():
    # Its data-parallel group starts the next step late for waiting on it: those peers are not to blame.
    for seed in range(3):
        ranks, planted, _ = build_mesh_set(DLRM, 64, "backward", 0.3, random.Random(f"straggler/{seed}"))
        assert named_culprits(ranks) == dict.fromkeys(planted, "backward")
        assert slow_groups(ranks) == []


def test_a_healthy_mesh_names_no_group():
    for seed in range(5):
        ranks, _, _ = build_mesh_set(DLRM, 128, "healthy", 0.2, random.Random(f"healthy/{seed}"))
        assert slow_groups(ranks) == [] and named_culprits(ranks) == {}


def test_a_slow_link_in_the_only_group_names_nothing():
    # A ring moves at its slowest link: every rank's all-reduce grows alike and no peer group compares.
    ranks, _ = build_set(DLRM, 32, "slow_link", 0.5, random.Random(3))
    ranks = [r.model_copy(update={"process_groups": []}) for r in ranks]
    assert slow_groups(ranks) == [] and named_culprits(ranks) == {}


def test_a_group_with_a_member_not_profiled_is_not_judged():
    # Its least-waiting member may be the missing one: the others' times include waiting for it.
    ranks, _, group = build_mesh_set(DLRM, 32, "slow_link_tp", 0.5, random.Random(5))
    missing = next(r.rank for r in ranks if any(g.name == group for g in r.process_groups))
    assert slow_groups([r for r in ranks if r.rank != missing]) == []


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=64))
def test_group_ranks_written_as_a_list_in_a_string_read_back(ranks):
    assert parse_group_ranks(str(ranks)) == tuple(ranks)
    assert parse_group_ranks(ranks) == tuple(ranks)


_ANY = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.lists(st.integers() | st.text(max_size=3), max_size=5)


@given(name=_ANY, ranks=_ANY, description=_ANY, size=_ANY, elements=_ANY)
def test_a_group_written_any_other_way_is_left_out_or_read_whole(name, ranks, description, size, elements):
    group = comm_group(name, ranks, description, size, elements)
    if group is not None:
        assert isinstance(group["group"], str) and group["group"]
        assert isinstance(group["group_size"], int) and group["group_size"] > 0
        assert isinstance(group["group_desc"], str) and isinstance(group["elements"], int) and group["elements"] >= 0


@pytest.mark.parametrize("text", ["[]", "", "[0, -1]", "[1, 2", "0, 1", "[a, b]", "[1.5]", "[٣]"])
def test_group_ranks_that_are_not_a_list_of_ranks_are_none(text):
    assert parse_group_ranks(text) is None
