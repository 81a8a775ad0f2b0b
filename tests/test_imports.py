"""Each process loads only its own code: a training worker pays for no analysis, service or CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

_FORBIDDEN_IN_WORKER = (
    "orchestrator.analysis",
    "orchestrator.traces",
    "orchestrator.service",
    "orchestrator.cli",
    "orchestrator.client",
    "actors.controller.actor",
    "actors.controller.runner",
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
