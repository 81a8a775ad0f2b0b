"""Pure functions over every rank's stacks: group, describe, and find collectives some ranks never joined.

Each rank's answer is stored as it arrives and only its :class:`RankDigest` is
kept: the bundle's summary is built from digests, never from every answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath

from actors.controller.diagnosis.activities import activity, waiting
from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.models.diagnosis import Frame, MissingRank, RankStacks, StackGroup, ThreadStack

__all__ = ["RankDigest", "collective_notes", "digest", "group_stacks", "rank_text", "ranks_text", "summary_line", "where"]

_StackKey = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class RankDigest:
    """What a bundle's summary needs of one rank's answer once that answer is stored."""

    # The training thread's frames; ranks with the same stack share one tuple.
    stack: tuple[Frame, ...]
    # Per process group: the rank's latest collective (seq, op, and whether an entry of it is open).
    latest: dict[str, tuple[int, str, bool]]
    flight_recorder_note: str | None
    native_note: str | None
    truncated: str | None


def digest(stacks: RankStacks, shared: dict[_StackKey, tuple[Frame, ...]]) -> RankDigest:
    """``stacks`` reduced to a digest; ``shared`` interns identical stacks across ranks."""
    thread = _training(stacks)
    frames = tuple(thread.frames) if thread is not None else ()
    latest: dict[str, tuple[int, str, bool]] = {}
    for c in stacks.collectives:
        seq, op, open_ = latest.get(c.process_group, (-1, "?", False))
        if c.seq > seq:
            latest[c.process_group] = (c.seq, c.op, not c.completed)
        elif c.seq == seq:
            latest[c.process_group] = (seq, c.op, open_ or not c.completed)
    return RankDigest(
        stack=shared.setdefault(_key(frames), frames),
        latest=latest,
        flight_recorder_note=stacks.flight_recorder_note,
        native_note=stacks.native_note,
        truncated=stacks.truncated,
    )


def _key(frames: Iterable[Frame]) -> _StackKey:
    return tuple((f.filename, f.line, f.function) for f in frames)


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 1``, ``ranks 0, 2–7``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}, {ordered[j]}" if j == i + 1 else f"{ordered[i]}–{ordered[j]}")
        i = j + 1
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(parts)


def _short(frame: Frame) -> str:
    return f"{PurePath(frame.filename).name}:{frame.line}"


def where(frames: list[Frame]) -> str:
    """Where a stack is, in words: the innermost frame, and the innermost frame of the job's own code."""
    if not frames:
        return "no Python frames"
    inner = frames[-1]
    user = next((f for f in reversed(frames) if not f.library), None)
    if user is None or user is inner:
        return f"{_short(inner)} in {inner.function}"
    return f"{inner.function} ({_short(inner)}) from {_short(user)} in {user.function}"


def _training(stacks: RankStacks) -> ThreadStack | None:
    return next((t for t in stacks.threads if t.training), None) or next(
        (t for t in stacks.threads if t.name == "MainThread"), None
    )


def group_stacks(digests: dict[int, RankDigest]) -> list[StackGroup]:
    """Ranks grouped by identical training-thread stacks; the majority last, outliers first.

    The majority is the largest group; on a tie, the group waiting in
    torch.distributed (the others wait on the odd one out), then the one
    with the lowest rank.
    """
    by_key: dict[_StackKey, list[int]] = {}
    frames_of: dict[_StackKey, tuple[Frame, ...]] = {}
    for rank in sorted(digests):
        frames = digests[rank].stack
        key = _key(frames)
        by_key.setdefault(key, []).append(rank)
        frames_of.setdefault(key, frames)
    if not by_key:
        return []

    majority = max(by_key, key=lambda k: (len(by_key[k]), waiting(frames_of[k]), -by_key[k][0]))
    others = sorted((k for k in by_key if k != majority), key=lambda k: (len(by_key[k]), by_key[k][0]))
    return [
        StackGroup(
            ranks=by_key[k],
            ranks_text=ranks_text(by_key[k]),
            where=where(list(frames_of[k])),
            waiting=waiting(frames_of[k]),
            activity=activity(frames_of[k]),
            majority=k == majority and len(by_key) > 1,
            frames=list(frames_of[k]),
        )
        for k in [*others, majority]
    ]


def summary_line(groups: list[StackGroup], missing: list[MissingRank]) -> str:
    """``rank 1 is in train.py:57 in slow_thing; ranks 0, 2–7 wait in all_reduce (...)``; a group whose frames
    say what it does says that first: ``ranks 0–7 are evaluating (trainer.py:2871 in evaluate), in linear (...)``."""
    parts = []
    for g in groups:
        many = len(g.ranks) > 1
        if g.waiting:
            doing = f", {g.activity}" if g.activity else ""
            parts.append(f"{g.ranks_text} {'wait' if many else 'waits'} in {g.where}{doing}")
        else:
            doing = f"{g.activity}, in" if g.activity else "in"
            parts.append(f"{g.ranks_text} {'are' if many else 'is'} {doing} {g.where}")
    if missing:
        parts.append(f"{ranks_text(m.rank for m in missing)} did not answer")
    return "; ".join(parts) or "no rank answered"


def collective_notes(digests: dict[int, RankDigest]) -> list[str]:
    """Collectives some ranks entered and others never joined, from the flight recorders."""
    seen: dict[str, dict[int, int]] = {}
    ops: dict[tuple[str, int], str] = {}
    open_: dict[tuple[str, int], bool] = {}
    for rank, d in digests.items():
        for pg, (seq, op, is_open) in d.latest.items():
            seen.setdefault(pg, {})[rank] = seq
            ops[(pg, seq)] = op
            open_[(pg, seq)] = open_.get((pg, seq), False) or is_open
    notes = []
    for pg, by_rank in sorted(seen.items()):
        lead = max(by_rank.values())
        behind = sorted(r for r, seq in by_rank.items() if seq < lead)
        op = ops.get((pg, lead), "?")
        if behind:
            joined = sorted(r for r, seq in by_rank.items() if seq == lead)
            lasts = sorted({by_rank[r] for r in behind})
            notes.append(
                f"process group {pg}: collective #{lead} ({op}) was entered by {ranks_text(joined)}; "
                f"{ranks_text(behind)} never joined it (last entered: #{', #'.join(map(str, lasts))})"
            )
        elif open_.get((pg, lead)):
            notes.append(f"process group {pg}: every rank is in collective #{lead} ({op}) and it has not completed")
    return notes


def rank_text(rank: int, info: WorkerInfo, stacks: RankStacks) -> str:
    """``stacks/rank{R}.txt``: every thread, outermost frame first, like a Python traceback."""
    lines = [f"rank {rank}  host {info.host}  pid {info.pid}  step {stacks.step}  taken {stacks.taken_at.isoformat()}"]
    if stacks.truncated:
        lines.append(stacks.truncated)
    lines.append("")
    for thread in stacks.threads:
        mark = "  (training thread)" if thread.training else ""
        lines.append(f'Thread {thread.thread_id} "{thread.name}"{mark}')
        for f in thread.frames:
            lines.append(f'  File "{f.filename}", line {f.line}, in {f.function}')
            if f.code:
                lines.append(f"    {f.code}")
        lines.append("")
    if stacks.native is not None:
        lines += ["native frames (py-spy dump --native):", stacks.native, ""]
    elif stacks.native_note:
        lines += [stacks.native_note, ""]
    if stacks.collectives:
        lines.append("flight recorder, last collectives:")
        lines += [
            f"  {c.process_group} #{c.seq} {c.op} {'completed' if c.completed else 'NOT COMPLETED'}"
            for c in stacks.collectives[-16:]
        ]
    elif stacks.flight_recorder_note:
        lines.append(stacks.flight_recorder_note)
    return "\n".join(lines) + "\n"
