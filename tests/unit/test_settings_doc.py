"""docs/configuration.md is generated from ``orchestrator.settings_doc`` and names every setting of
``orchestrator.settings`` with the default the code uses; README links to it instead of keeping a copy."""

from __future__ import annotations

from orchestrator import settings, settings_doc
from tests.support.common import REPO


def _settings() -> set[str]:
    return {getattr(settings, n) for n in dir(settings) if n.endswith("_ENV_VAR")}


def test_every_setting_has_a_row_and_every_row_a_setting():
    documented = settings_doc.documented()
    assert len(documented) == len(set(documented)), "a setting has two rows"
    assert set(documented) == _settings()


def test_the_page_is_current():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == settings_doc.render(), "docs/configuration.md is stale: run `make docs`"


def test_numeric_defaults_are_read_from_the_code_not_written_by_hand():
    for section in settings_doc.SECTIONS:
        for row in section.rows:
            stems = [next(n for n in dir(settings) if getattr(settings, n) == env and n.endswith("_ENV_VAR")) for env in row.env_vars]
            numeric = all(isinstance(getattr(settings, "DEFAULT_" + s.removesuffix("_ENV_VAR"), None), int | float) for s in stems)
            assert numeric == (row.default is None), f"{row.env_vars}: numeric defaults come from DEFAULT_*"


def test_byte_sizes_are_shown_in_mib():
    row = next(r for s in settings_doc.SECTIONS for r in s.rows if r.env_vars == (settings.MAX_TRACE_BYTES_ENV_VAR,))
    assert row.default_text() == "512 MiB"


def test_readme_links_the_page_and_keeps_no_copy_of_the_table():
    readme = (REPO / "README.md").read_text()
    assert "docs/configuration.md" in readme
    assert not any(line.startswith("| `RAYPROF_") for line in readme.splitlines())
