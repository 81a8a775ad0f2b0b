"""Every setting in ``orchestrator.settings`` is in README's settings table, with its default."""

from __future__ import annotations

import re

from orchestrator import settings
from tests.conftest import REPO

_ROW = re.compile(r"^\| (`RAYPROF_[A-Z0-9_]+`(?: / `RAYPROF_[A-Z0-9_]+`)*) \| .* \| (.+) \|$")


def _readme_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in (REPO / "README.md").read_text().splitlines():
        m = _ROW.match(line)
        if m and "TEST_" not in m.group(1):
            names = re.findall(r"RAYPROF_[A-Z0-9_]+", m.group(1))
            defaults = [d.strip() for d in m.group(2).split(" / ")]
            for i, name in enumerate(names):
                rows[name] = defaults[i] if len(defaults) == len(names) else m.group(2)
    return rows


def _settings() -> dict[str, str]:
    return {getattr(settings, n): n.removesuffix("_ENV_VAR") for n in dir(settings) if n.endswith("_ENV_VAR")}


def test_every_setting_has_a_readme_row_and_every_row_a_setting():
    assert sorted(_readme_rows()) == sorted(_settings())


def test_numeric_defaults_in_the_readme_match_the_code():
    rows = _readme_rows()
    for env, stem in _settings().items():
        default = getattr(settings, f"DEFAULT_{stem}", None)
        cell = rows[env]
        if isinstance(default, int | float) and re.fullmatch(r"[0-9.]+", cell):
            assert float(cell) == float(default), f"{env}: README says {cell}, code says {default}"
