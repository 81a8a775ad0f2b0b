"""Clock alignment on the 64-rank folder of ``analysis_scale``, with every rank's clock moved by a known amount.

The folder is HTA's A100 traces ``nccl_parser`` (AllReduce and Broadcast
kernels) and ``negative_queue`` (SendRecv kernels) alternated over 64 ranks,
re-ranked with every event kept; so each rank's merge scan is its source's
scan, and each source is scanned once here (the folder itself, 1.14 GB raw,
is what ``analysis_scale`` times). Each rank's collective ends are then moved
by a random offset of -50 ms to +50 ms and a drift of up to 100 ppm
(``end + offset + drift * (end - first end)``), and
:func:`~orchestrator.traces.clocks.align` runs on the moved scans.

The two sources share no collective name, so the ranks form two groups
(even ranks on rank 0, odd ranks on rank 1) that are aligned within
themselves, and with each other on wall clocks only (the alignment note says
so). Within a group the ranks are copies of one recording, so the truth is
known: the moved clocks, undone. Rows: the largest error against that truth
(target 20 µs), whether every rank's reported bound (``residual_us``) covered
its true error, and the time the fit takes.
"""

from __future__ import annotations

import dataclasses
import random
import time

from benchmarks import LogFn
from benchmarks._stats import Result
from benchmarks.analysis_scale import _SOURCES
from orchestrator.models.merge_stats import RankAlignment
from orchestrator.traces.clocks import align, wall_clock_note
from orchestrator.traces.discover import TraceFile
from orchestrator.traces.merge_plan import RankScan, scan_rank

NAME = "clock_alignment"
MAX_OFFSET_US = 50_000.0
MAX_DRIFT = 100e-6
TARGET_US = 20.0
SOURCES = ("nccl_parser", "negative_queue")


def _moved(scan: RankScan, offset: float, drift: float) -> RankScan:
    t0 = min(e for by_name in scan.ends.values() for ends in by_name.values() for e in ends)
    ends = {
        device: {name: [e + offset + drift * (e - t0) for e in v] for name, v in by_name.items()}
        for device, by_name in scan.ends.items()
    }
    return dataclasses.replace(scan, ends=ends)


def _worst(scans: list[RankScan], clocks: list[tuple[float, float]], alignment: list[RankAlignment]) -> tuple[float, int]:
    """The largest error (µs) against the truth over every rank's collectives, and how many ranks' bounds it broke."""
    by_rank = {a.rank: a for a in alignment}
    worst, broken = 0.0, 0
    for s, (offset, drift), a in zip(scans, clocks, alignment):
        root = a
        while root.reference is not None:
            root = by_rank[root.reference]
        if root is a:
            continue
        root_offset, root_drift = clocks[root.rank]
        errors = []
        for device, by_name in s.ends.items():
            for ends in by_name.values():
                t0 = min(e for v in s.ends[device].values() for e in v)
                for e in ends:
                    # Copies of one recording: the root's k-th end is this rank's k-th end, at the same true time.
                    here = a.merged_us(e + offset + drift * (e - t0))
                    there = root.merged_us(e + root_offset + root_drift * (e - t0))
                    errors.append(abs(here - there))
        if errors:
            worst = max(worst, max(errors))
            broken += max(errors) > (a.residual_us or 0.0)
    return worst, broken


def run(quick: bool, log: LogFn) -> list[Result]:
    """Align 64 ranks (and 1,024 without --quick) under random clocks, a few trials each."""
    missing = [str(p) for p in _SOURCES.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"external traces missing: {missing}")
    source_scans = [scan_rank(TraceFile(rank=0, path=_SOURCES[name])) for name in SOURCES]
    rng = random.Random(24)
    results: list[Result] = []
    for ranks in (64,) if quick else (64, 1024):
        scans = [dataclasses.replace(source_scans[r % len(SOURCES)], rank=r) for r in range(ranks)]
        errors: list[float] = []
        seconds: list[float] = []
        broken = 0
        note = None
        for _ in range(3 if quick else 10):
            clocks = [(rng.uniform(-MAX_OFFSET_US, MAX_OFFSET_US), rng.uniform(-MAX_DRIFT, MAX_DRIFT)) for _ in range(ranks)]
            moved = [_moved(s, *c) for s, c in zip(scans, clocks)]
            started = time.perf_counter()
            alignment = align(moved, 0)
            seconds.append(time.perf_counter() - started)
            worst, bad = _worst(scans, clocks, alignment)
            errors.append(worst)
            broken += bad
            note = wall_clock_note(alignment)
        bench = f"{NAME}[{ranks} ranks]"
        log(f"{bench}: worst error {max(errors):.2f} µs, bounds broken {broken}, align {max(seconds) * 1000:.0f} ms")
        results += [
            Result.of(bench, "largest error against the moved clocks (per trial)", "µs", errors,
                      target=f"<= {TARGET_US:.0f} µs", met=max(errors) <= TARGET_US,
                      note=f"offsets ±{MAX_OFFSET_US / 1000:.0f} ms, drift ±{MAX_DRIFT * 1e6:.0f} ppm; {note}"),
            Result(bench, "ranks whose residual_us was below their true error", "ranks", float(broken), n=len(errors),
                   target="0", met=broken == 0),
            Result.of(bench, "align() time", "ms", [s * 1000 for s in seconds]),
        ]
    return results
