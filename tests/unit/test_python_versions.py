"""rayprof runs on Python 3.10 and later (``requires-python``): checked statically, since only one
Python runs the suite here. vermin finds the oldest Python each construct, module and member needs.

What a static checker cannot see is listed where the code works around it: ``asyncio.wait_for``
raises ``asyncio.TimeoutError``, not the builtin ``TimeoutError``, on 3.10 (caught by that name).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.common import REPO

OLDEST = "3.10"
SOURCES = ["orchestrator", "actors", "tests", "benchmarks", "deploy"]


def test_requires_python_names_the_oldest_python_checked():
    # Read as text: tomllib is 3.11's, and these tests hold to 3.10 too.
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'requires-python = ">={OLDEST}"' in pyproject
    assert f'"Programming Language :: Python :: {OLDEST}"' in pyproject


def test_no_code_needs_a_python_newer_than_the_oldest_supported():
    # --eval-annotations: pydantic evaluates annotations at run time, so they count.
    # --backport typing_extensions: its names stand in for newer typing's.
    done = subprocess.run(
        [str(Path(sys.executable).with_name("vermin")), f"-t={OLDEST}-", "--violations", "--eval-annotations",
         "--backport", "typing_extensions", "--no-tips", "--no-parse-comments", *SOURCES],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
