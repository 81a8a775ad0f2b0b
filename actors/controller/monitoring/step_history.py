"""Each live run's step-time history per rank, from the heartbeats the controller already holds.

A rank's history is three tiers of fixed capacity, each a ring of points at
its own resolution: 1 s for the last 10 minutes, 10 s for 2 hours, 1 minute
for 24 hours. Every heartbeat goes into all three (a point keeps the last
heartbeat's time and step in its interval and the mean of the step times
reported in it), so no tier is computed from another and a coarse tier never
loses what a fine one dropped. Points are packed in typed arrays (time
float64, step int64, step time float32: 20 bytes), so a rank costs at most
2,760 points x 20 bytes = 54 KiB however long the job runs.

Samples are taken on the monitor tick, not in the poll handler: the
heartbeat path stays as it was.
"""

from __future__ import annotations

import gzip
import json
import math
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from actors.controller.agents.registry import Worker
from actors.controller.monitoring.history_answer import Snapshot

__all__ = ["TIERS", "History", "RankHistory", "RunHistory", "Tier", "compress"]


@dataclass(frozen=True)
class Tier:
    resolution_s: float
    span_s: float

    @property
    def capacity(self) -> int:
        return int(self.span_s / self.resolution_s)


TIERS = (Tier(1.0, 600.0), Tier(10.0, 7200.0), Tier(60.0, 86400.0))
_NAN = float("nan")


def compress(dump: bytes) -> bytes:
    """What is stored: a dump, gzipped (off the event loop: it takes ~0.1 s per 1,000 ranks)."""
    return gzip.compress(dump, compresslevel=1)


class _Ring:
    """Fixed-capacity columns; grows to ``capacity`` then overwrites the oldest point."""

    __slots__ = ("capacity", "dt", "head", "step", "t")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t = array("d")
        self.step = array("q")
        self.dt = array("f")
        self.head = 0

    def append(self, t: float, step: int, dt: float) -> None:
        if len(self.t) < self.capacity:
            self.t.append(t)
            self.step.append(step)
            self.dt.append(dt)
            return
        i = self.head
        self.t[i], self.step[i], self.dt[i] = t, step, dt
        self.head = (i + 1) % self.capacity

    def ordered(self) -> tuple[array, array, array]:
        """The columns oldest first (slices: copied at C speed)."""
        h = self.head
        return self.t[h:] + self.t[:h], self.step[h:] + self.step[:h], self.dt[h:] + self.dt[:h]

    def __iter__(self) -> Iterator[tuple[float, int, float]]:
        return zip(*self.ordered(), strict=True)


class _TierSeries:
    """One tier of one rank: the ring, plus the point still being filled."""

    __slots__ = ("bucket", "count", "last_step", "last_t", "resolution_s", "ring", "sum_dt")

    def __init__(self, tier: Tier) -> None:
        self.resolution_s = tier.resolution_s
        self.ring = _Ring(tier.capacity)
        self.bucket = -1
        self.last_t = 0.0
        self.last_step = 0
        self.sum_dt = 0.0
        self.count = 0

    def add(self, t: float, step: int, dt: float | None) -> None:
        bucket = int(t // self.resolution_s)
        if bucket != self.bucket:
            self._flush()
            self.bucket, self.sum_dt, self.count = bucket, 0.0, 0
        self.last_t, self.last_step = t, step
        if dt is not None:
            self.sum_dt += dt
            self.count += 1

    def _flush(self) -> None:
        if self.bucket >= 0:
            self.ring.append(self.last_t, self.last_step, self.sum_dt / self.count if self.count else _NAN)

    def pending(self) -> tuple[float, int, float] | None:
        if self.bucket < 0:
            return None
        return self.last_t, self.last_step, self.sum_dt / self.count if self.count else _NAN

    def columns(self) -> tuple[array, array, array]:
        t, step, dt = self.ring.ordered()
        last = self.pending()
        if last is not None:
            t.append(last[0])
            step.append(last[1])
            dt.append(last[2])
        return t, step, dt

    def points(self) -> Iterator[tuple[float, int, float]]:
        yield from self.ring
        last = self.pending()
        if last is not None:
            yield last


class RankHistory:
    """Every tier of one rank."""

    __slots__ = ("tiers",)

    def __init__(self) -> None:
        self.tiers = [_TierSeries(t) for t in TIERS]

    def add(self, t: float, step: int, step_time_s: float | None) -> None:
        for tier in self.tiers:
            tier.add(t, step, step_time_s)

    def points(self, tier: int, since: float) -> list[tuple[float, int, float]]:
        return [p for p in self.tiers[tier].points() if p[0] >= since]


@dataclass
class RunHistory:
    """One run's ranks, and when each rank's heartbeat was last recorded (controller clock)."""

    target: str
    run: str
    ranks: dict[int, RankHistory] = field(default_factory=dict)
    recorded: dict[int, float] = field(default_factory=dict)
    last_t: float = 0.0

    def add(self, rank: int, t: float, step: int, step_time_s: float | None) -> None:
        self.ranks.setdefault(rank, RankHistory()).add(t, step, step_time_s)
        self.last_t = max(self.last_t, t)

    def snapshot(self, span_s: float, now: float, ranks: list[int] | None = None) -> Snapshot:
        """The points of every rank (or those in ``ranks``) at the finest tier that covers the last
        ``span_s``, copied so :func:`actors.controller.monitoring.history_answer.answer` can read them off the loop."""
        tier = next((i for i, t in enumerate(TIERS) if t.span_s >= span_s), len(TIERS) - 1)
        chosen = sorted(self.ranks if ranks is None else set(ranks) & self.ranks.keys())
        columns = [(rank, *self.ranks[rank].tiers[tier].columns()) for rank in chosen]
        return Snapshot(self.target, self.run, TIERS[tier].resolution_s, span_s, now, columns)

    # ---- saving -------------------------------------------------------------

    def dump(self) -> bytes:
        """Header (JSON) and every tier's points as raw arrays, oldest first; :func:`compress` it."""
        ranks: list[tuple[int, list[int]]] = []
        body: list[bytes] = []
        for rank, history in sorted(self.ranks.items()):
            counts = []
            for tier in history.tiers:
                columns = tier.columns()
                counts.append(len(columns[0]))
                body.extend(column.tobytes() for column in columns)
            ranks.append((rank, counts))
        head = json.dumps({"version": 1, "target": self.target, "run": self.run, "ranks": ranks}).encode()
        return b"".join([struct.pack("<I", len(head)), head, *body])

    @classmethod
    def load(cls, data: bytes) -> RunHistory:
        raw = gzip.decompress(data)
        if len(raw) < 4:
            raise ValueError("truncated history")
        (n,) = struct.unpack_from("<I", raw)
        header = json.loads(raw[4 : 4 + n])
        if header.get("version") != 1:
            raise ValueError(f"unknown history version {header.get('version')!r}")
        run = cls(target=header["target"], run=header["run"])
        offset = 4 + n
        for rank, counts in header["ranks"]:
            history = run.ranks[rank] = RankHistory()
            for tier, count in zip(history.tiers, counts, strict=True):
                columns = []
                for code in ("d", "q", "f"):
                    column = array(code)
                    size = column.itemsize * count
                    column.frombytes(raw[offset : offset + size])
                    offset += size
                    columns.append(column)
                # Restored points are complete: the point being filled starts anew.
                keep = tier.ring.capacity
                tier.ring.t, tier.ring.step, tier.ring.dt = (c[-keep:] if len(c) > keep else c for c in columns)
                if count:
                    run.last_t = max(run.last_t, columns[0][-1])
        return run


class History:
    """Every run's history; ``record`` is called once per monitor tick."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], RunHistory] = {}

    def record(self, workers: Iterable[Worker], now: float, wall: float) -> None:
        """Add each worker's heartbeat that arrived since the last call (``now``: controller clock)."""
        for w in workers:
            if not w.samples:
                continue  # registered, no heartbeat yet
            key = (w.info.target, w.run)
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = RunHistory(*key)
            rank = w.info.world_rank
            if run.recorded.get(rank, -math.inf) >= w.seen_at:
                continue
            run.recorded[rank] = w.seen_at
            run.add(rank, wall - (now - w.seen_at), w.step, w.step_time_s)

    def forget_ended(self, wall: float, kept_s: float) -> list[RunHistory]:
        """Drop runs without a heartbeat for ``kept_s``; returns them (memory here, storage by the caller)."""
        ended = [r for r in self.runs.values() if wall - r.last_t > kept_s]
        for r in ended:
            del self.runs[(r.target, r.run)]
        return ended

    def adopt(self, saved: RunHistory) -> None:
        """A run saved before a restart; runs already recorded since are kept as they are."""
        self.runs.setdefault((saved.target, saved.run), saved)
