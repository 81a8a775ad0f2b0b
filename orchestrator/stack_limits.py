"""One rank's stacks answer under a size limit, and a note saying what was cut.

The agent cuts its own answer (``RAYPROF_STACKS_MAX_RANK_BYTES``, sent with
each ``stacks`` command); the controller cuts again whatever still arrives
over it (an older agent, a broken one), so no rank can make a bundle large.
"""

from __future__ import annotations

from orchestrator.models.diagnosis import RankStacks

__all__ = ["answer_bytes", "bound_stacks"]

# Room kept for the note itself and the JSON around what is cut.
_MARGIN = 1024
# What the last resort keeps of a note or a flight recorder list.
_NOTE_CHARS = 400
_COLLECTIVES = 64


def answer_bytes(stacks: RankStacks) -> int:
    """Size of ``stacks`` as JSON (its text is valid UTF-8: see ``SafeText``)."""
    return len(stacks.model_dump_json())


def bound_stacks(stacks: RankStacks, max_bytes: int) -> RankStacks:
    """``stacks`` cut to at most ``max_bytes`` of JSON; unchanged when it fits.

    Cut in the order of least use to a reader: the flight recorder dump (its
    collectives stay), the tail of the native frames, threads other than the
    training thread (last first), the training thread's outermost frames; as a
    last resort every stack. ``truncated`` says what went.
    """
    original = answer_bytes(stacks)
    if original <= max_bytes:
        return stacks
    budget = max(0, max_bytes - _MARGIN)
    cut: list[str] = []
    if stacks.flight_recorder is not None:
        cut.append(f"the flight recorder dump ({len(stacks.flight_recorder)} chars)")
        stacks = stacks.model_copy(update={"flight_recorder": None})
    stacks = _cut_native(stacks, budget, cut)
    stacks = _cut_threads(stacks, budget, cut)
    if answer_bytes(stacks) > budget:
        cut.append("every stack (a single frame was over the limit)")
        stacks = stacks.model_copy(
            update={
                "threads": [],
                "native": None,
                "collectives": stacks.collectives[-_COLLECTIVES:],
                "native_note": _short(stacks.native_note),
                "flight_recorder_note": _short(stacks.flight_recorder_note),
            }
        )
    note = f"answer of {original} bytes cut to the {max_bytes}-byte limit: dropped " + ", ".join(cut)
    return stacks.model_copy(update={"truncated": _short(note)})


def _short(text: str | None) -> str | None:
    return text if text is None or len(text) <= _NOTE_CHARS else text[: _NOTE_CHARS - 1] + "…"


def _cut_native(stacks: RankStacks, budget: int, cut: list[str]) -> RankStacks:
    native = stacks.native
    size = answer_bytes(stacks)
    if native is None or size <= budget:
        return stacks
    # A char is 1 to 6 bytes of JSON: cut by the excess and measure again, a few times at most.
    keep = len(native)
    for _ in range(4):
        keep = max(0, keep - (size - budget))
        size = answer_bytes(stacks.model_copy(update={"native": native[:keep]}))
        if size <= budget or keep == 0:
            break
    if size > budget:
        keep = 0
    cut.append(f"the last {len(native) - keep} chars of the native frames")
    return stacks.model_copy(update={"native": native[:keep] if keep else None})


def _cut_threads(stacks: RankStacks, budget: int, cut: list[str]) -> RankStacks:
    size = answer_bytes(stacks)
    if size <= budget:
        return stacks
    threads = list(stacks.threads)
    dropped = 0
    # Sizes measured once: a thousand threads must not cost a thousand dumps.
    for i in range(len(threads) - 1, -1, -1):
        if size <= budget:
            break
        if threads[i].training:
            continue
        size -= len(threads[i].model_dump_json()) + 1
        del threads[i]
        dropped += 1
    if dropped:
        cut.append(f"{dropped} threads other than the training thread")
    training = next((i for i, t in enumerate(threads) if t.training), None)
    if size > budget and training is not None:
        frames = list(threads[training].frames)
        outer = 0
        while size > budget and outer < len(frames):
            size -= len(frames[outer].model_dump_json()) + 1
            outer += 1
        cut.append(f"the training thread's {outer} outermost frames")
        threads[training] = threads[training].model_copy(update={"frames": frames[outer:]})
    return stacks.model_copy(update={"threads": threads})
