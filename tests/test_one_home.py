"""Facts with one home: each rule or constant below is defined in one file and imported
everywhere else, so two copies cannot drift apart."""

from __future__ import annotations

import re

import pytest
from pydantic import TypeAdapter

from orchestrator.models.common import Name, to_name
from orchestrator.service.security import FRAMED_REPORT_CSP, REPORT_CSP
from tests.conftest import REPO


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text()
        for package in ("actors", "orchestrator")
        for path in (REPO / package).rglob("*.py")
    }


def _files_matching(pattern: str) -> list[str]:
    return sorted(path for path, text in _sources().items() if re.search(pattern, text))


def test_the_name_rule_is_written_only_in_the_models():
    # The characters a target or profile id may hold: the model, the console's path
    # parameter and the agent's cleaning of a run name all take them from one place.
    assert _files_matching(re.escape("A-Za-z0-9._=-")) == ["orchestrator/models/common.py"]


@pytest.mark.parametrize(
    "run_name", ["train", "my run/1", "..", "../../etc", "-x", "", "ü" * 200, "a..b", "job=1.v2", "_lead"]
)
def test_any_run_name_made_a_target_name_is_a_valid_name(run_name):
    name = to_name(run_name)
    assert TypeAdapter(Name).validate_python(name) == name


def test_a_valid_name_is_kept_as_it_is():
    assert to_name("run-1.v2_a=b") == "run-1.v2_a=b"


def test_the_report_policies_are_defined_once_and_differ_only_in_who_may_frame_the_report():
    assert _files_matching(r"(?m)^\s*\w*REPORT_CSP\s*=") == ["orchestrator/service/security.py"]
    assert "frame-ancestors 'none'" in REPORT_CSP and "sandbox" in REPORT_CSP
    assert FRAMED_REPORT_CSP == REPORT_CSP.replace("frame-ancestors 'none'", "frame-ancestors 'self'").replace(
        "sandbox", "sandbox allow-same-origin"
    )
    assert "allow-scripts" not in FRAMED_REPORT_CSP and "default-src 'none'" in FRAMED_REPORT_CSP


def test_the_merged_trace_cap_is_read_from_the_environment_in_one_place():
    assert _files_matching(r"env_\w+\(\s*(\w+\.)?MAX_MERGED_BYTES_ENV_VAR") == ["orchestrator/config.py"]


def test_the_max_merged_bytes_setting_reaches_the_merge(monkeypatch):
    from orchestrator.config import max_merged_bytes

    monkeypatch.setenv("RAYPROF_MAX_MERGED_BYTES", "150000")
    assert max_merged_bytes() == 150000
