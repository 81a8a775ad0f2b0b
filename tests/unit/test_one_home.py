"""Facts with one home: each rule or constant below is defined in one file and imported
everywhere else, so two copies cannot drift apart."""

from __future__ import annotations

import re

import pytest
from pydantic import TypeAdapter

from orchestrator import layout
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.common import Name, to_name
from orchestrator.service.security import FRAMED_REPORT_CSP, REPORT_CSP
from tests.support.common import REPO


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


# A storage key joined by hand: an f-string that puts "/" after a folder (``{prefix}/``,
# ``{STATE_ROOT}/``, ``{profile.storage_uri}/``), one that writes a layout file name into a
# key, or a folder with "/" added on for a listing. Keys come from orchestrator/layout.py and
# a profile's files are addressed through ``storage.scoped(folder)``; only those two homes join.
_LAYOUT_NAMES = "|".join(name for name in layout.__all__ if name.endswith(("_NAME", "_SUFFIX", "_SUFFIXES")))
_HAND_JOINED = re.compile(
    r'f"\{[^}"]*(?:prefix|folder|ROOT|_uri)\b[^}"]*\}/'
    rf"|\{{(?:{_LAYOUT_NAMES})\}}"
    r'|(?:prefix|folder|ROOT)\w*(?:\([^()]*\))?\s*\+\s*"/"'
)
_KEY_HOMES = ("orchestrator/layout.py", "orchestrator/storage/")


def _lines_matching(pattern: re.Pattern[str], outside: tuple[str, ...] = ()) -> list[str]:
    return [
        f"{path}:{number}: {line.strip()}"
        for path, text in sorted(_sources().items())
        if not path.startswith(outside)
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_storage_key_is_joined_by_hand_outside_the_layout_and_the_storage():
    assert _lines_matching(_HAND_JOINED, outside=_KEY_HOMES) == []


@pytest.mark.parametrize(
    "line",
    [
        'storage.download(f"{prefix}/{artifact.key}", path)',
        'storage.delete(f"{profile.prefix}/{name}")',
        'storage.get_bytes(f"{profile_prefix(manifest.target, manifest.profile_id)}/{key}")',
        'uri = open_storage(home).uri(f"{STATE_ROOT}/{self._cluster}")',
        'profile.manifest_uri = f"{profile.storage_uri}/{MANIFEST_NAME}"',
        'storage.put_bytes(data, f"run/{STACKS_NAME}", "stacks_summary")',
        'keys = storage.list(lease_prefix(self._cluster) + "/")',
        'keys = storage.list(self._prefix + "/")',
    ],
)
def test_the_hand_joined_key_check_catches_each_way_a_key_was_joined(line):
    assert _HAND_JOINED.search(line)


@pytest.mark.parametrize(
    "line",
    [
        'f"{done}/{len(items)} ranks"',
        'f"{url}/docs"',
        'f"{request.scope.get(\'root_path\', \'\')}/v1/profiles/"',
        'out(f"rayprof service: {SERVE_APP_NAME}")',
    ],
)
def test_the_hand_joined_key_check_lets_counts_and_urls_be(line):
    assert not _HAND_JOINED.search(line)


def test_controller_state_is_written_as_state_and_only_the_manifest_with_kind_manifest():
    # State (saved profiles, index, leases, histories) is no artifact: it goes through put_state.
    writes = _lines_matching(re.compile(r'put_bytes\b.*"manifest"'))
    assert [line.split(":")[0] for line in writes] == ["orchestrator/manifest.py"]


def test_a_storage_root_is_normalized_only_by_the_storage_spec():
    uses = re.compile(r"\bnormalize_uri\b(?!\(uri)")  # not its definition
    used = [line for line in _lines_matching(uses) if "import normalize_uri" not in line and '"normalize_uri"' not in line]
    assert [line.split(":")[0] for line in used] == ["orchestrator/models/agent_protocol.py"]
    assert StorageSpec(uri="s3://b/p/").uri == "s3://b/p"
    assert StorageSpec(uri="/tmp/a/../b").uri == StorageSpec(uri="file:///tmp/b").uri == "file:///tmp/b"
