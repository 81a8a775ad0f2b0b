"""The wheel works on its own: built with `python -m build`, installed by pip into a fresh venv
without the ``dev`` extra (as a cluster image or a runtime_env would), run from outside the checkout.

The venv installs the exact torch build running these tests first (the CPU one here: an unpinned
torch would pull the multi-GB CUDA build), then the wheel and its dependencies through pip's cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from orchestrator.build import build_id
from tests.support.common import REPO
from tests.unit.test_imports import _FORBIDDEN_IN_WORKER

CONSOLE_FILES = (
    "index.html", "app.js", "targets.js", "history.js", "profile.js", "stacks.js", "watches.js", "compare.js", "app.css"
)


def _run(*args: str | Path, cwd: Path, timeout: float = 900) -> str:
    # A fresh environment: no PYTHONPATH, which would show pip and Python the checkout (and its egg-info).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", out, REPO, cwd=out)
    [built] = out.glob("rayprof-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel and its runtime dependencies only; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel-venv")
    _run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    bin_ = root / "venv" / "bin"
    # --no-compile: byte-compiling every file of torch and Ray up front is half this install's time
    # on two cores (113 s against 53 s); what is imported compiles when it is.
    _run(bin_ / "pip", "install", "-q", "--no-compile", f"torch=={metadata.version('torch')}", cwd=root)
    # Beside the Ray (and the FastAPI and protobuf it works with) of the environment running the tests,
    # as a cluster image has them: the oldest-Ray run checks the wheel on the oldest Ray and its pins.
    beside = [f"{name}=={metadata.version(name)}" for name in ("fastapi", "protobuf")]
    out = _run(bin_ / "pip", "install", "--no-compile", f"ray[train,serve]=={metadata.version('ray')}", *beside, wheel, cwd=root)
    assert (bin_ / "rayprof").is_file(), out[-3000:]
    return bin_


def _python(venv: Path, code: str) -> str:
    # cwd outside the checkout: only the installed package can be imported.
    return _run(venv / "python", "-c", code, cwd=venv.parent.parent)


def test_the_wheel_holds_the_packages_and_the_console_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for name in CONSOLE_FILES:
        assert f"orchestrator/service/console/{name}" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_version_and_help_come_from_the_installed_package(venv):
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    # The build id is the code's, wherever it is installed: the wheel's is the source tree's.
    assert _run(venv / "rayprof", "--version", cwd=venv).strip() == f"rayprof {version} (build {build_id()})"
    assert "profile" in _run(venv / "rayprof", "--help", cwd=venv)


def test_no_dev_package_is_installed_and_every_module_imports_without_one(venv):
    dev_only = ["pytest", "moto", "hypothesis", "playwright", "schemathesis", "anyscale", "hta", "vermin", "build"]
    missing = _python(venv, f"import importlib.util as u; print([m for m in {dev_only!r} if u.find_spec(m)])")
    assert missing.strip() == "[]"
    code = (
        "import importlib, pkgutil, orchestrator, actors\n"
        "for pkg in (orchestrator, actors):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        # __main__ runs the CLI; orchestrator.mcp needs the mcp extra (test below)\n"
        "        if not m.name.endswith('.__main__') and not m.name.startswith('orchestrator.mcp'):\n"
        "            importlib.import_module(m.name)\n"
        "print('ok')"
    )
    assert _python(venv, code).strip() == "ok"


def test_rayprof_mcp_without_the_mcp_extra_says_how_to_install_it(venv):
    # The core install stays without the MCP SDK; the one command that needs it says what to install.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYPROF_TOKEN")}
    done = subprocess.run(
        [str(venv / "rayprof"), "mcp"], capture_output=True, text=True, cwd=venv, timeout=120, env=env,
        stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 1 and "pip install 'rayprof[mcp]'" in done.stderr, done.stderr[-2000:]


def test_importing_the_agent_loads_no_analysis_service_or_cli_module(venv):
    out = _python(venv, "import json, sys, actors.agent\nprint(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(out.splitlines()[-1])
    assert [m for m in loaded if m.startswith(_FORBIDDEN_IN_WORKER)] == []


def test_the_console_is_served_from_the_installed_files(venv):
    code = (
        "from fastapi.testclient import TestClient\n"
        "from orchestrator.service.app import api\n"
        "c = TestClient(api)\n"
        f"print([(n, c.get('/console/' + n).status_code) for n in {CONSOLE_FILES!r}], c.get('/').text[:200])"
    )
    out = _python(venv, code)
    assert all(f"('{n}', 200)" in out for n in CONSOLE_FILES), out
    assert "<html" in out.lower(), out


def test_metadata_names_licence_python_versions_and_classifiers(venv):
    code = (
        "import json\nfrom importlib import metadata\nm = metadata.metadata('rayprof')\n"
        "print(json.dumps({k: m.get_all(k) for k in ('License-Expression', 'Requires-Python', 'Classifier')}))"
    )
    meta = json.loads(_python(venv, code))
    assert meta["License-Expression"] == ["Apache-2.0"]
    assert meta["Requires-Python"] == [">=3.10"]
    assert "Programming Language :: Python :: 3.10" in meta["Classifier"]
