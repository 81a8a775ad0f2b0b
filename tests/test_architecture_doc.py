"""docs/architecture.md's code map names every module that exists, and only modules that exist.

The code map is the table under "## Code map": one row per package, its first
cell the package path (`actors/agent/`), its last cell the modules by their
path under that package (`hook.py`, `console/__init__.py`).
"""

from __future__ import annotations

import re

from tests.conftest import REPO

DOC = REPO / "docs" / "architecture.md"
SECTION = "## Code map"
_ROW = re.compile(r"^\| `((?:actors|orchestrator)/(?:[\w/]+/)?)` \|.*\| (.*) \|$")
_MODULE = re.compile(r"`([\w/]+\.py)`")


def _code_map() -> set[str]:
    """Module paths the code map names, repository-relative."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/architecture.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            package, cell = m.groups()
            for module in _MODULE.findall(cell):
                path = module if module.startswith(("actors/", "orchestrator/")) else package + module
                named.add(path)
    return named


def _modules() -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for package in ("actors", "orchestrator")
        for path in (REPO / package).rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts
    }


def test_every_module_is_in_the_code_map_and_every_named_module_exists():
    named = _code_map()
    existing = _modules()
    missing = sorted(existing - named)
    stale = sorted(m for m in named - existing if not (REPO / m).is_file())  # an __init__.py named for its logic exists
    assert not missing and not stale, (
        "docs/architecture.md's code map is out of date.\n"
        f"Modules missing from it ({len(missing)}): {missing}\n"
        f"Named in it but not in the tree ({len(stale)}): {stale}"
    )
