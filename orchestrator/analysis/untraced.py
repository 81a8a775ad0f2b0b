"""What the training thread runs where its trace shows no op: Ray Data's iterator handing over the next batch, Ray
Train's ``report()``, or Python of its own.

Neither runs a torch op while it waits, so a trace without Python stacks shows an empty stretch of the step, and
an empty stretch before the backward pass reads as the model's forward (:func:`orchestrator.analysis.phases.
unmarked_forward`): a job that waits 150 ms a step for Ray Data was told it spends 150 ms in forward, and nothing
to fix. Two sources say what runs there: a ``with_stack`` trace's Python spans, and the stack samples the agent
writes into every trace it records (:class:`orchestrator.models.samples.FrameSamples`). A stretch is a sampled
kind's from its first sample of that kind to its last, widened halfway to the neighbouring samples and out to the
stretch's ends; a stretch no sample lands in (one shorter than the sampling interval, mostly) stays unnamed.

- Ray Data: any frame of ``ray/data/`` (``DataIterator.iter_torch_batches`` and the generators under it; in a Ray
  Train worker ``get_dataset_shard``'s iterator is one). Its time is the data phase's, as a DataLoader's is.
- Ray Train's report: a ``report`` function of ``ray/train/`` or ``ray/air/``. In Ray Train 2 every call agrees on
  a checkpoint folder with every other worker through the run's synchronization actor, checkpoint or not (a
  barrier of all workers and a round trip to an actor); in Ray Train 1 it hands the result to the driver and waits.
- Python of the loop's own, outside torch: a sample none of whose frames is torch's (the model's call, autograd, the
  optimizer, the DataLoader and the profiler all run under torch's frames): the user's code or a library's
  (a per-sample loop, a tokenizer, numpy, a logger), named by stack samples only (a with_stack span holds no
  callers to tell). Not the model's forward, whatever it precedes.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from orchestrator.analysis.intervals import Intervals, subtract, union
from orchestrator.analysis.python_frames import HOT_SHARE, frame_parts, sampled_path, user_frames
from orchestrator.analysis.trace_metadata import read_metadata
from orchestrator.models.analysis import OpStat
from orchestrator.models.samples import FRAMES_METADATA_KEY, FrameSamples
from orchestrator.traces.loader import Span

__all__ = [
    "RAY_DATA_ITERATOR", "Timeline", "Untraced", "frames_or_samples", "kind_of", "read_samples", "sample_kind", "train_version", "untraced_waits",
]

# What the analysis calls the loader of a job fed by Ray Data (RankSummary.data_loader): its iterator's class.
RAY_DATA_ITERATOR = "ray.data.DataIterator"


class Untraced(str, Enum):
    """Code the training thread waits in without running an op, that a report can name."""

    RAY_DATA = "ray_data"
    TRAIN_REPORT = "train_report"
    PYTHON = "python"


_RAY_DATA = re.compile(r"^ray/data/")
_RAY_TRAIN = re.compile(r"^ray/(?:train|air)/")
_TRAIN_V2 = re.compile(r"^ray/train/v2/")
_TORCH = re.compile(r"^torch/")


def kind_of(frames: Iterable[str]) -> Untraced | None:
    """The kind of the innermost of ``frames`` (innermost first, as with_stack names them) that is one."""
    for frame in frames:
        parts = frame_parts(frame)
        if parts is None:
            continue
        path, func = parts
        if _RAY_DATA.match(path):
            return Untraced.RAY_DATA
        if func.rsplit(".", 1)[-1] == "report" and _RAY_TRAIN.match(path):  # a sample names a method with its class
            return Untraced.TRAIN_REPORT
    return None


def sample_kind(stack: Sequence[str]) -> Untraced | None:
    """The kind of a stack sample (innermost frame first): a Ray kind of :func:`kind_of`, else Python of the loop's
    own where no frame is torch's."""
    kind = kind_of(stack)
    if kind is not None or not stack:
        return kind
    in_torch = any(_TORCH.match(parts[0]) for f in stack if (parts := frame_parts(f)) is not None)
    return None if in_torch else Untraced.PYTHON


def train_version(frames: Iterable[Span], timeline: Timeline | None) -> Literal[1, 2] | None:
    """Which Ray Train (1 or 2) the job's report() calls run in, by their frames; None where it calls none."""
    names = [f.name for f in frames]
    if timeline is not None:
        names += [f for stack, kind in zip(timeline.stacks, timeline.kinds) if kind is Untraced.TRAIN_REPORT for f in stack]
    reports = [parts[0] for name in names if (parts := frame_parts(name)) and kind_of([name]) is Untraced.TRAIN_REPORT]
    if not reports:
        return None
    return 2 if any(_TRAIN_V2.match(path) for path in reports) else 1


def read_samples(header: Mapping[str, Any]) -> tuple[FrameSamples | None, str | None]:
    """A trace's stack samples (None where it has none), and why they were not read where they are malformed."""
    return read_metadata(header, FRAMES_METADATA_KEY, FrameSamples, "stack samples")


@dataclass(frozen=True)
class Timeline:
    """A trace's stack samples on the trace's own clock, in time order."""

    times: list[float]
    stacks: list[list[str]]  # each sample's stack, innermost frame first
    kinds: list[Untraced | None]  # each sample's kind
    interval_ms: float

    @classmethod
    def read(cls, header: Mapping[str, Any], base_us: float) -> tuple[Timeline | None, str | None]:
        """A trace's samples (from its ``header``) on its clock, whose times count from ``base_us`` (None where it
        has none), and why they were not read where they are malformed."""
        samples, unread = read_samples(header)
        return (cls.of(samples, base_us) if samples is not None else None), unread

    @classmethod
    def of(cls, samples: FrameSamples, base_us: float) -> Timeline:
        """``samples`` (unix times) on the clock of a trace whose times count from ``base_us``."""
        kinds = [sample_kind(stack) for stack in samples.stacks]
        ordered = sorted(samples.samples)
        return cls(
            times=[t - base_us for t, _ in ordered], stacks=[samples.stacks[i] for _, i in ordered],
            kinds=[kinds[i] for _, i in ordered], interval_ms=samples.interval_ms,
        )

    def within(self, a: float, b: float) -> range:
        """The indices of the samples taken in ``[a, b)``."""
        return range(bisect_left(self.times, a), bisect_left(self.times, b))

    def paths(
        self, groups: Sequence[Intervals], windows: Sequence[tuple[float, float]], at_line: bool = False
    ) -> list[tuple[int, list[OpStat]]]:
        """For each group of stretches (a step's work before its batch, the loop's own Python), its samples and their
        hot path (:func:`~orchestrator.analysis.python_frames.sampled_path`) from where it leaves the code the rest
        of the ``windows`` run: its outer frames are the loop's own (a Trainer's training loop), which every step's
        samples hold too; the first frame on the path whose function (wherever in it; ``at_line``: at the line the
        path names, so the loop's own line that calls the work begins it) no sample outside the groups holds is
        where that work begins."""
        outside = subtract(union(windows), union(iv for group in groups for iv in group))
        key = (lambda f: f) if at_line else frame_parts
        seen = {key(f) for a, b in outside for i in self.within(a, b) for f in self.stacks[i]}
        out: list[tuple[int, list[OpStat]]] = []
        for group in groups:
            stacks = [self.stacks[i] for a, b in group for i in self.within(a, b)]
            path = sampled_path(stacks, HOT_SHARE, self.interval_ms) if stacks else []
            begins = next((k for k, f in enumerate(path) if key(f.name) not in seen), len(path))
            out.append((len(stacks), path[begins:]))
        return out


    def frames(self, gaps: Intervals) -> list[Span]:
        """Python frames as a with_stack trace would show them where the main thread runs no op (``gaps``: sorted,
        apart): each sample's frames, outermost first, over its stretch of a gap (:func:`_stretches`' boundaries):
        what names the Python outside any op that leaves a device idle in a trace without stacks."""
        out: list[Span] = []
        for a, b in gaps:
            inside = self.within(a, b)
            for (start, end), i in zip(_reach([self.times[i] for i in inside], a, b), inside):
                out += [Span(ts=start, end=end, name=f, cat="python_function", pid=0, tid=0) for f in reversed(self.stacks[i])]
        return out


def frames_or_samples(frames: Sequence[Span], timeline: Timeline | None, pieces: Intervals) -> Sequence[Span]:
    """The user's or a library's Python frames over ``pieces`` (sorted, apart): a with_stack trace's ``frames``, else
    the stack samples of ``timeline`` taken there, as frames (:meth:`Timeline.frames`); none without either."""
    return frames or (user_frames(timeline.frames(pieces)) if timeline else [])


def untraced_waits(frames: Sequence[Span], timeline: Timeline | None, gaps: Intervals) -> dict[Untraced, Intervals]:
    """Where the main thread waits in each kind: its with_stack ``frames`` of that kind, and the stretches of
    ``gaps`` (sorted, apart: where it runs no op) that the samples of ``timeline`` name."""
    found: dict[Untraced, list[tuple[float, float]]] = {kind: [] for kind in Untraced}
    for span in frames:
        kind = kind_of([span.name])
        if kind is not None:
            found[kind].append((span.ts, span.end))
    if timeline is not None:
        for a, b in gaps:
            inside = [(timeline.times[i], timeline.kinds[i]) for i in timeline.within(a, b)]
            for s0, s1, kind in _stretches(inside, a, b):
                found[kind].append((s0, s1))
    return {kind: union(spans) for kind, spans in found.items()}


def _stretches(inside: Sequence[tuple[float, Untraced | None]], a: float, b: float) -> list[tuple[float, float, Untraced]]:
    """The stretches of the gap ``[a, b)`` each kind holds, from the samples ``inside`` it (:func:`_reach`)."""
    reach = _reach([t for t, _ in inside], a, b)
    return [(start, end, kind) for (start, end), (_, kind) in zip(reach, inside) if kind is not None]


def _reach(times: Sequence[float], a: float, b: float) -> list[tuple[float, float]]:
    """The stretch of the gap ``[a, b)`` each sample taken in it (at ``times``, in order) stands for: a boundary
    between two samples lies halfway between them; the first and last samples reach the gap's ends."""
    last = len(times) - 1
    return [(a if i == 0 else (times[i - 1] + t) / 2, b if i == last else (t + times[i + 1]) / 2) for i, t in enumerate(times)]
