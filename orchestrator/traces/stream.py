"""Stream a Chrome trace file (``.json`` or ``.json.gz``) without loading it whole.

A torch.profiler trace is one JSON object whose ``traceEvents`` array holds
nearly all of its bytes. :func:`iter_trace` walks the top-level object and
yields each top-level key with its value, except that ``traceEvents`` is
yielded one event at a time, so memory stays bounded by the largest single
event, not the file. It uses the C JSON scanner (``json.JSONDecoder.raw_decode``)
on a sliding text buffer, so no extra dependency is needed.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

__all__ = ["TraceParseError", "iter_trace", "open_text", "read_header"]

# Big enough that the per-chunk Python overhead disappears, small enough to stay
# far below a rank's trace size.
CHUNK_CHARS = 1 << 18

_WHITESPACE = " \t\n\r"
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_DECODER = json.JSONDecoder()

Item = tuple[Literal["key"], str, Any] | tuple[Literal["event"], None, dict[str, Any]]


class TraceParseError(ValueError):
    """The file is not a Chrome trace we can read; the message says where and why."""


def open_text(path: Path) -> io.TextIOBase:
    """Open a trace as text, gunzipping when the file starts with the gzip magic."""
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class _Reader:
    """A text buffer over a file that refills on demand; positions are buffer-relative."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self._stream = stream
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front, for error offsets

    def _refill(self) -> bool:
        if self.eof:
            return False
        chunk = self._stream.read(CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        # Drop what was already parsed so the buffer never grows with the file.
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """Next non-whitespace character, or '' at end of file."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self._refill():
                return ""

    def expect(self, char: str) -> None:
        got = self.peek()
        if got != char:
            raise TraceParseError(f"expected {char!r} at character {self.consumed + self.pos}, found {got or 'end of file'!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode one JSON value, reading more text until it is complete."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._refill():
                    continue
                raise TraceParseError(f"invalid JSON at character {self.consumed + exc.pos}: {exc.msg}") from None
            # A number cut at the buffer's end decodes fine but may go on: read more first.
            if end == len(self.buf) and self._refill():
                continue
            self.pos = end
            return value


def iter_trace(path: Path, *, events: bool = True) -> Iterator[Item]:
    """Yield ``("key", name, value)`` for top-level keys and ``("event", None, event)`` per trace event.

    Items come in file order. With ``events=False`` the walk stops at the
    ``traceEvents`` key (torch writes its metadata before it), which makes
    reading a header cheap. Raises :class:`TraceParseError` (also for gzip
    and encoding damage) where the file stops being a readable trace; items
    yielded before that point are valid.
    """
    try:
        with open_text(path) as stream:
            reader = _Reader(stream)
            reader.expect("{")
            if reader.peek() == "}":
                return
            while True:
                key = reader.value()
                if not isinstance(key, str):
                    raise TraceParseError(f"expected a key at character {reader.consumed + reader.pos}")
                reader.expect(":")
                if key == "traceEvents":
                    if not events:
                        return
                    yield from _iter_events(reader)
                else:
                    yield ("key", key, reader.value())
                sep = reader.peek()
                if sep == "}":
                    return
                reader.expect(",")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        # gzip raises BadGzipFile (an OSError) or EOFError on truncated members.
        raise TraceParseError(f"{type(exc).__name__}: {exc}") from None


def _iter_events(reader: _Reader) -> Iterator[Item]:
    reader.expect("[")
    if reader.peek() == "]":
        reader.pos += 1
        return
    decode, separator = _DECODER.raw_decode, _SEPARATOR.match
    while True:
        # Fast path: the event and the separator after it are both in the buffer.
        buf, start = reader.buf, reader.pos
        try:
            event, end = decode(buf, start)
            match = separator(buf, end)
        except json.JSONDecodeError:
            match = None
        if match is not None and match.end() < len(buf):
            reader.pos = match.end()
            if isinstance(event, dict):
                yield ("event", None, event)
            if match.group(1) == "]":
                return
            continue
        # Slow path at a buffer boundary (or a damaged file): read on, or fail with a position.
        reader.pos = start
        if reader.peek() == "]":  # a trailing comma, as some older kineto versions write
            reader.pos += 1
            return
        event = reader.value()
        if isinstance(event, dict):
            yield ("event", None, event)
        if reader.peek() == "]":
            reader.pos += 1
            return
        reader.expect(",")


def read_header(path: Path) -> dict[str, Any]:
    """Top-level keys other than ``traceEvents``; reads past the events only when needed.

    torch writes ``distributedInfo`` and ``baseTimeNanoseconds`` before the
    events, so usually only the first few hundred bytes are read.
    """
    header = {key: value for _, key, value in iter_trace(path, events=False)}
    if "baseTimeNanoseconds" in header or "distributedInfo" in header:
        return header
    # Not torch's layout: the metadata may follow the events.
    return {key: value for kind, key, value in iter_trace(path) if kind == "key"}
