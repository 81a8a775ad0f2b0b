"""What the CLI prints: a stacks bundle's status, and a reader that stops reading."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone

from orchestrator.cli.output import print_status, set_results
from orchestrator.models.profile import ProfileStatus, RankResult
from orchestrator.models.requests import ProfileState, RankState
from tests.support.common import RAYPROF_CLI, REPO

_AT = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _printed(status: ProfileStatus, tmp_path) -> list[str]:
    path = tmp_path / "out.txt"
    with path.open("w") as f:
        previous = set_results(f)
        try:
            print_status(status)
        finally:
            set_results(previous)
    return path.read_text().splitlines()


def _bundle(state: ProfileState, manifest_uri: str | None) -> ProfileStatus:
    return ProfileStatus(
        id="stk-20261201-062545-970f6a90", kind="stacks", target="hangy", state=state, storage_uri="file:///s",
        manifest_uri=manifest_uri, created_at=_AT,
        ranks=[RankResult(rank=r, state=RankState.DONE) for r in (0, 1)],
    )


def test_a_stacks_bundles_status_has_no_steps_and_says_how_to_read_its_stacks(tmp_path):
    lines = _printed(_bundle(ProfileState.DONE, "file:///s/hangy/stk-20261201-062545-970f6a90/manifest.json"), tmp_path)

    assert lines[1].split() == ["rank", "host", "state", "uploaded", "reason"]
    assert lines[-1] == "stacks: rayprof report stk-20261201-062545-970f6a90"


def test_a_bundle_without_a_manifest_names_no_command_to_read_it(tmp_path):
    lines = _printed(_bundle(ProfileState.FAILED, None), tmp_path)

    assert not any(line.startswith("stacks:") for line in lines)


def test_a_reader_that_stops_reading_ends_the_cli_quietly(tmp_path):
    folder = tmp_path / "healthy"
    shutil.copytree(REPO / "tests" / "data" / "traces" / "healthy", folder)
    read_end, write_end = os.pipe()
    cli = subprocess.Popen([RAYPROF_CLI, "analyze", str(folder)], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)  # the reader is gone before the CLI writes its first line, as `| head -0` would be
    _, stderr = cli.communicate(timeout=120)

    said = stderr.decode(errors="replace")
    assert (cli.returncode, "Traceback" in said or "BrokenPipeError" in said) == (1, False), said
