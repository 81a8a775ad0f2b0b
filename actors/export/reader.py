"""Read a Chrome trace one event at a time, in memory bounded by the largest event.

A trace is ``{..., "traceEvents": [event, ...], ...}``. The reader decodes
the top-level fields as they come and yields each event with its size in
bytes, holding only a window of the file: about one chunk plus the event
being decoded. Each event is parsed by the standard library's C scanner
(``json.JSONDecoder.raw_decode``); an event cut by the end of the window is
parsed again once the window has grown to twice its length, so the work
stays linear in the file's size.

Standard library only: the export child imports it and must start fast.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["CHUNK_BYTES", "EVENTS_KEY", "MAX_VALUE_BYTES", "Event", "MalformedTrace", "TraceReader"]

CHUNK_BYTES = 1024 * 1024
MAX_VALUE_BYTES = 64 * 1024 * 1024
"""Largest single event or top-level field: a trace with a larger one is refused, not loaded."""

EVENTS_KEY = "traceEvents"
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# After an event: its separator, and the whitespace before the next event when the window holds it.
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


class MalformedTrace(ValueError):
    """The file is not a Chrome trace this reader can stream."""


Event = tuple[Any, int, str]
"""An element of ``traceEvents``: its value, its size in UTF-8 bytes, and its text ("" unless asked for)."""


class TraceReader:
    """One pass over a trace file: :meth:`events` yields each :data:`Event`.

    ``header`` holds every top-level field but the events; it is complete once
    :meth:`events` is exhausted (fields may follow the event array).
    ``on_bytes`` sees every byte read from the file, in order (to compress a
    copy in the same pass). ``keep_text``: also yield each event's original text.
    """

    def __init__(
        self,
        path: Path,
        *,
        on_bytes: Callable[[bytes], None] | None = None,
        keep_text: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
        self._path = Path(path)
        self._on_bytes = on_bytes
        self._keep_text = keep_text
        self._chunk_bytes = chunk_bytes
        self._max_value_bytes = max_value_bytes
        self.header: dict[str, Any] = {}
        self._decoder = json.JSONDecoder()
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._file: BinaryIO | None = None
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._ascii = True
        self._consumed = 0  # characters dropped from the front of the window so far

    def events(self) -> Iterator[Event]:
        """Every element of ``traceEvents`` in file order."""
        with open(self._path, "rb") as self._file:
            self._expect("{")
            if self._peek() == "}":
                self._pos += 1
                return
            while True:
                key = self._value()
                if not isinstance(key, str):
                    raise MalformedTrace("a top-level key is not a string")
                self._expect(":")
                if key == EVENTS_KEY:
                    yield from self._array()
                else:
                    self.header[key] = self._value()
                separator = self._peek()
                self._pos += 1
                if separator == "}":
                    break
                if separator != ",":
                    raise MalformedTrace(f"expected ',' or '}}' after top-level field {key!r}, found {separator!r}")
            if self._peek(allow_eof=True) != "":
                raise MalformedTrace("data after the end of the trace object")

    def _array(self) -> Iterator[Event]:
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            return
        scan = self._decoder.scan_once
        keep_text = self._keep_text
        while True:
            # Fast path, nearly every event: it and the separator after it lie inside the window.
            buf, start = self._buf, self._pos
            try:
                value, end = scan(buf, start)
            except (StopIteration, ValueError):
                end = -1
            separator = _SEPARATOR.match(buf, end) if end > 0 else None
            if separator is not None:
                if self._ascii:
                    size, text = end - start, buf[start:end] if keep_text else ""
                else:
                    text = buf[start:end]
                    size, text = len(text.encode("utf-8")), text if keep_text else ""
                self._pos = separator.end()
                yield value, size, text
                if separator.group(1) == "]":
                    return
                continue
            # Slow path: the event or its separator runs past the window (or is malformed).
            yield self._value_and_size()
            found = self._peek()
            self._pos += 1
            if found == "]":
                return
            if found != ",":
                raise MalformedTrace(f"expected ',' or ']' between events, found {found!r}")
            self._skip()

    def _value(self) -> Any:
        return self._value_and_size()[0]

    def _value_and_size(self) -> Event:
        """Decode the JSON value at the cursor, reading more of the file as needed."""
        start = self._skip()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, start)
            except json.JSONDecodeError as e:
                if self._eof:
                    raise MalformedTrace(f"invalid JSON near character {self._offset(start)}: {e.msg}") from None
            else:
                # A number or literal ending exactly at the window's end may continue past it.
                if end < len(self._buf) or self._eof:
                    self._pos = end
                    text = self._buf[start:end] if self._keep_text or not self._ascii else ""
                    size = end - start if self._ascii else len(text.encode("utf-8"))
                    return value, size, text if self._keep_text else ""
            if len(self._buf) - start > self._max_value_bytes:
                raise MalformedTrace(
                    f"a value at character {self._offset(start)} is over {self._max_value_bytes} bytes (or malformed)"
                )
            start = self._grow(start)

    def _offset(self, index: int) -> int:
        return self._consumed + index

    def _skip(self) -> int:
        """Move the cursor past whitespace, reading as needed; returns it."""
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf) or self._eof:
                return self._pos
            self._pos = self._grow(self._pos)

    def _peek(self, *, allow_eof: bool = False) -> str:
        self._skip()
        if self._pos < len(self._buf):
            return self._buf[self._pos]
        if allow_eof:
            return ""
        raise MalformedTrace("the trace ends early")

    def _expect(self, char: str) -> None:
        found = self._peek()
        if found != char:
            raise MalformedTrace(f"expected {char!r} at character {self._offset(self._pos)}, found {found!r}")
        self._pos += 1

    def _grow(self, keep_from: int) -> int:
        """Drop the window before ``keep_from`` and read at least as much as it keeps; returns ``keep_from``'s new index."""
        assert self._file is not None
        kept = self._buf[keep_from:]
        want = max(self._chunk_bytes, len(kept))
        parts = [kept]
        got = 0
        while got < want and not self._eof:
            data = self._file.read(want - got)
            if not data:
                self._eof = True
                parts.append(self._utf8.decode(b"", final=True))
                break
            got += len(data)
            if self._on_bytes is not None:
                self._on_bytes(data)
            parts.append(self._utf8.decode(data))
        self._consumed += keep_from
        self._buf = "".join(parts)
        # O(1) in CPython: a str knows whether it is ASCII. Sizes are then character counts.
        self._ascii = self._buf.isascii()
        self._pos -= keep_from
        return 0
