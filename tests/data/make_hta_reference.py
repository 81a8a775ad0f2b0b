"""Record Holistic Trace Analysis' (HTA) figures for the external traces: tests/data/hta_reference.json.

    python tests/data/make_hta_reference.py          # every case (about 6 minutes on 2 cores)
    python tests/data/make_hta_reference.py CASE...  # some cases, merged into the file

For each ``../shared/external-traces/<case>/traces`` folder HTA can load, per
rank: ``TraceAnalysis.get_temporal_breakdown`` (idle and compute shares of the
GPU's active span) and ``get_comm_comp_overlap`` (share of communication
kernel time overlapped by computation; absent without collectives). A case HTA
cannot load is kept with HTA's error, so the table says why it is missing.

Loading every trace with HTA takes minutes, far beyond a unit test's budget:
tests/unit/test_hta_agreement.py compares the analysis with this file on every
case, and reruns HTA live on the small cases to check that the file still
holds what HTA says.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXTERNAL = REPO.parent / "shared" / "external-traces"
OUT = Path(__file__).parent / "hta_reference.json"


def hta_figures(folder: Path) -> dict[str, Any]:
    """HTA's per-rank idle %, compute % and comm/comp overlap % for one folder of traces."""
    logging.disable(logging.WARNING)  # HTA logs every rank it parses
    from hta.trace_analysis import TraceAnalysis

    with warnings.catch_warnings():
        # HTA warns of its own 0/0 on a trace without collectives (and pandas of HTA's calls): not ours to fix.
        warnings.simplefilter("ignore")
        analysis = TraceAnalysis(trace_dir=str(folder))
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        overlap_rows = analysis.get_comm_comp_overlap(visualize=False)
    overlap = {int(row["rank"]): row["comp_comm_overlap_pctg"] for _, row in overlap_rows.iterrows()}
    ranks = {}
    for _, row in breakdown.iterrows():
        rank = int(row["rank"])
        pctg = overlap.get(rank)
        ranks[str(rank)] = {
            "idle_time_pctg": float(row["idle_time_pctg"]),
            "compute_time_pctg": float(row["compute_time_pctg"]),
            # HTA divides by zero communication time: NaN means no collectives.
            "comp_comm_overlap_pctg": None if pctg is None or math.isnan(pctg) else float(pctg),
        }
    return {"ranks": ranks}


def main(cases: list[str]) -> None:
    reference = json.loads(OUT.read_text()) if OUT.exists() else {"cases": {}}
    reference["hta_version"] = version("HolisticTraceAnalysis")
    for case in cases or sorted(p.name for p in EXTERNAL.iterdir() if (p / "traces").is_dir()):
        try:
            reference["cases"][case] = hta_figures(EXTERNAL / case / "traces")
        except Exception as exc:  # HTA's own failure is the fact recorded
            reference["cases"][case] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        print(case, json.dumps(reference["cases"][case]), flush=True)
    reference["cases"] = dict(sorted(reference["cases"].items()))
    OUT.write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
