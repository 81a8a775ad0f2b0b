"""Submit keys: a client that retries a submit (after a timeout, a dropped connection) with the
same ``Idempotency-Key`` gets the profile its first try made, not a second window.

A key stands for one request: the same key with another request is refused (HTTP 422). Keys are
kept for a day, the newest ``_KEPT`` at most, and are saved with their profile (its state file and
the index), so a restarted controller still knows them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from actors.controller.clock import SYSTEM_CLOCK, Clock
from orchestrator.errors import IdempotencyKeyReusedError
from orchestrator.models.common import IdempotencyKey
from orchestrator.models.requests import ProfileRequest

__all__ = ["KEY_TTL", "SubmitKey", "SubmitKeys"]

# A client retries within minutes; a day covers any retry loop and bounds memory with the cap.
KEY_TTL = timedelta(hours=24)
# ~300 bytes each: a few MiB at most, however many submits a day brings.
_KEPT = 10_000


class SubmitKey(BaseModel):
    """A submit's key and the request it was given for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: IdempotencyKey
    request_sha256: str

    @classmethod
    def of(cls, key: str, request: ProfileRequest) -> SubmitKey:
        return cls(key=key, request_sha256=hashlib.sha256(request.model_dump_json().encode()).hexdigest())


class SubmitKeys:
    """Key -> the profile it made, oldest first."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        # The wall clock: keys are dated as their profiles are, and a restart compares those dates.
        self._clock = clock
        self._made: OrderedDict[str, tuple[SubmitKey, str, datetime]] = OrderedDict()

    def find(self, wanted: SubmitKey, exists: Callable[[str], bool]) -> str | None:
        """The id of the profile ``wanted.key`` made, if it ``exists`` still (a deleted one frees its key).
        Raises :class:`IdempotencyKeyReusedError` when the key was given with another request."""
        self._expire()
        entry = self._made.get(wanted.key)
        if entry is None:
            return None
        held, profile_id, _ = entry
        if not exists(profile_id):
            del self._made[wanted.key]
            return None
        if held.request_sha256 != wanted.request_sha256:
            raise IdempotencyKeyReusedError(
                f"Idempotency-Key {wanted.key!r} was already used for another request (it made profile "
                f"{profile_id}); send a new key with a new request",
                profile_id=profile_id,
            )
        return profile_id

    def remember(self, key: SubmitKey, profile_id: str, at: datetime) -> None:
        self._made[key.key] = (key, profile_id, at)
        self._made.move_to_end(key.key)
        while len(self._made) > _KEPT:
            self._made.popitem(last=False)

    def forget(self, key: SubmitKey, profile_id: str) -> None:
        """Drop ``key`` if it still names ``profile_id``: its submit could not be saved."""
        entry = self._made.get(key.key)
        if entry is not None and entry[1] == profile_id:
            del self._made[key.key]

    def restore(self, made: Iterable[tuple[SubmitKey | None, str, datetime]]) -> None:
        """Take in the keys of restored profiles (key, profile id, created at), oldest first."""
        cutoff = self._clock.wall() - KEY_TTL
        kept = sorted(((k, p, at) for k, p, at in made if k is not None and at >= cutoff), key=lambda m: m[2])
        for key, profile_id, at in kept:
            self.remember(key, profile_id, at)

    def _expire(self) -> None:
        cutoff = self._clock.wall() - KEY_TTL
        while self._made and next(iter(self._made.values()))[2] < cutoff:
            self._made.popitem(last=False)
