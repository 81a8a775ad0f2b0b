"""Each process loads only its own code: a training worker pays for no analysis, service or CLI."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.support.common import REPO

_FORBIDDEN_IN_WORKER = (
    "orchestrator.analysis",
    "orchestrator.traces",
    "orchestrator.service",
    "orchestrator.cli",
    "orchestrator.client",
    "actors.controller.actor",
    "actors.controller.profiles.runner",
    "fastapi",
    "starlette",
)


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_agent_loads_no_analysis_service_or_cli_module():
    loaded = _modules_after("import actors.agent, actors.agent.capture, actors.controller.handle")
    assert [m for m in loaded if m.startswith(_FORBIDDEN_IN_WORKER)] == []


def test_the_export_child_loads_neither_torch_nor_pydantic():
    loaded = _modules_after("import actors.export.exporter, actors.export.contract")
    assert [m for m in loaded if m.split(".")[0] in ("torch", "pydantic", "ray")] == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: they run under a type checker only."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def _import_graph() -> dict[str, set[str]]:
    """Each module of ours and the modules of ours it imports, at the top or inside a function."""
    paths = {_module_name(p): p for package in ("actors", "orchestrator") for p in (REPO / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_only(tree)
        imported: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    imported.add(sub if sub in paths else node.module)
        graph[name] = {m for m in imported if m in paths and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_even_through_imports_inside_functions():
    # docs/architecture.md says there is none; a lazy import inside a function still closes a circle.
    assert _circles(_import_graph()) == []
