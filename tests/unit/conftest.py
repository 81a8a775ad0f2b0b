"""Unit tests keep their scratch files in their own folder, never in the machine's temp folder."""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _private_temp_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path_factory.mktemp("tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))  # and the child processes'
