"""HTA run in a fresh interpreter, for tests that run inside a process with Ray in it.

HTA parses several ranks in a ``fork()``ed pool and ends it with SIGTERM. A child forked from
a Ray driver keeps Ray's native SIGTERM handler, which prints a symbolized stack trace and can
hang on a lock that another thread of the parent (Ray's, a test S3 server's) held at the fork:
the pool's join then waits forever (CI timed out after 600 s in ``test_hta_agreement``). A
fresh interpreter has only HTA's own threads to fork.

    python -m tests.support.hta_apart figures|steps FOLDER    # prints the answer as JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[2]
_TIMEOUT_S = 300


def hta(kind: Literal["figures", "steps"], folder: Path) -> Any:
    """``kind`` of HTA's answers for the traces in ``folder``, from a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.hta_apart", kind, str(folder)],
        cwd=REPO, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"HTA ({kind}) failed on {folder}: {done.stderr[-3000:]}")
    return json.loads(done.stdout)


def _steps(folder: Path) -> dict[str, list[str]]:
    """Each rank HTA loaded, with the ``ProfilerStep#N`` names it kept."""
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder))
    symbols = analysis.t.symbol_table.sym_table
    return {
        str(rank): sorted(n for n in (symbols[i] for i in analysis.t.get_trace(rank)["name"].unique())
                          if n.startswith("ProfilerStep#"))
        for rank in sorted(analysis.t.traces)
    }


def main() -> None:
    kind, folder = sys.argv[1], Path(sys.argv[2])
    if kind == "figures":
        from tests.data.make_hta_reference import hta_figures

        answer = hta_figures(folder)
    else:
        answer = _steps(folder)
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
