"""Every MCP answer fits a budget an agent's context can hold, and carries no storage credential.

An answer over :data:`MAX_ANSWER_BYTES` (its JSON) loses the tail of its longest
lists, longest first, until it fits; its ``truncated`` field says what was cut, so
an agent knows to ask narrower (one profile, fewer ranks, a shorter span) rather
than reason over a silently partial picture.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel

__all__ = ["MAX_ANSWER_BYTES", "answer", "cap", "cut", "public_uri", "rounded"]

MAX_ANSWER_BYTES = 24 * 1024
"""The JSON of one answer, at most: a few thousand tokens (the wire carries it as text and as structure)."""

M = TypeVar("M", bound=BaseModel)

_MAX_ROUNDS = 256
_MAX_NOTES = 8


def public_uri(uri: str | None) -> str | None:
    """``uri`` without user info or query: an endpoint written ``http://key:secret@host`` or a
    presigned link would otherwise hand the storage's credentials to whoever reads the answer."""
    if uri is None:
        return None
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        return "(unparseable location withheld)"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _size(data: Any) -> int:
    return len(json.dumps(data, separators=(",", ":"), default=str))


def _lists(data: Any, path: str, found: list[tuple[int, str, list[Any]]]) -> int:
    """Collect every list of two or more items under ``data`` with its own weight: its JSON size
    less the lists nested in it, so leaves (points, frames) are cut before what holds them (ranks).
    Returns the size of the lists ``data`` is or holds, for the caller's own weight."""
    if isinstance(data, dict):
        return sum(_lists(v, f"{path}.{k}" if path else str(k), found) for k, v in data.items())
    if not isinstance(data, list):
        return 0
    nested = sum(_lists(v, f"{path}[{i}]", found) for i, v in enumerate(data))
    size = _size(data)
    if len(data) > 1:
        found.append((size - nested, path, data))
    return size


def cut(data: Any, max_bytes: int = MAX_ANSWER_BYTES) -> str | None:
    """Cut ``data`` (JSON-like, in place) to ``max_bytes`` of JSON: its largest lists lose their
    tails (every list here is ordered most important first). Returns what was cut, in words."""
    if _size(data) <= max_bytes:
        return None
    cuts: dict[str, tuple[int, int]] = {}
    for _ in range(_MAX_ROUNDS):
        if _size(data) <= max_bytes:
            break
        found: list[tuple[int, str, list[Any]]] = []
        _lists(data, "", found)
        if not found:
            break
        _, path, items = max(found, key=lambda f: f[0])
        before = cuts.get(path, (len(items), 0))[0]
        keep = max(1, len(items) // 2)
        del items[keep:]
        cuts[path] = (before, keep)
    notes = [f"{path}: {kept} of {total}" for path, (total, kept) in cuts.items()]
    if len(notes) > _MAX_NOTES:
        notes = [*notes[:_MAX_NOTES], f"{len(notes) - _MAX_NOTES} more lists"]
    note = f"answer cut to {max_bytes} bytes, kept " + "; ".join(notes) if notes else ""
    if _size(data) > max_bytes:
        note = (note + "; " if note else "") + "still over the cap: ask for less (one rank, a shorter span)"
    return note


def rounded(data: Any) -> Any:
    """Floats to 3 decimals, or 3 significant digits below 1: a microsecond of a step time, a
    p-value's or fraction's third digit is all an answer needs; 17 digits triple its bytes."""
    if isinstance(data, float):
        return round(data, 3) if abs(data) >= 1 or data == 0 else float(f"{data:.3g}")
    if isinstance(data, dict):
        return {k: rounded(v) for k, v in data.items()}
    if isinstance(data, list):
        return [rounded(v) for v in data]
    return data


def cap(result: M, max_bytes: int = MAX_ANSWER_BYTES) -> M:
    """``result`` with its floats :func:`rounded`, cut to ``max_bytes`` of JSON (see :func:`cut`),
    its ``truncated`` field saying what was cut."""
    if "truncated" not in type(result).model_fields:
        raise TypeError(f"{type(result).__name__} has no `truncated` field to say what a cut left out")
    data = rounded(result.model_dump(mode="json"))
    note = cut(data, max_bytes)
    if note is not None:
        data["truncated"] = note
    return type(result).model_validate(data)


def answer(result: BaseModel) -> CallToolResult:
    """A tool's answer: ``result`` capped, as structured content and as the same JSON in compact text (the SDK
    would indent it, a third more bytes of an agent's context for nothing)."""
    capped = cap(result)
    return CallToolResult(
        content=[TextContent(type="text", text=capped.model_dump_json())],
        structured_content=capped.model_dump(mode="json"),
    )
