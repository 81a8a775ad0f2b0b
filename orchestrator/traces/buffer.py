"""The bytes of one trace file, read on demand and cut into batches of whole events.

How a batch is cut without a byte-by-byte scanner: the array's elements are
separated by ``}``, whitespace, ``,``. The reader picks such a place past the
batch's target size and decodes ``[`` + the bytes up to it + ``]``. A place
inside a string or a nested value leaves an unterminated string or an unclosed
bracket, so the decode fails: a batch that decodes was cut at a true element
boundary. On a failed cut the target shrinks (x1/4); when even the first
candidate fails (an event holding ``},`` in a string, damage, or a huge value),
one element is read exactly: the stdlib scanner finds its end in a window that
doubles up to :data:`MAX_VALUE_BYTES`, and msgspec decodes that slice. Every
step costs at most a constant factor of the bytes it consumes, so time stays
linear; the buffer never holds more than one value's bound plus a chunk.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
from isal import igzip, isal_zlib

__all__ = [
    "FIRST_BATCH_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_VALUE_BYTES",
    "READ_ERRORS",
    "Buffer",
    "Refused",
    "TraceParseError",
    "open_binary",
    "valid_prefix",
]

CHUNK_BYTES = 1 << 20
# One event or header value larger than this rejects the trace: real events are
# under 1 MB, a header (distributedInfo of a 10k-rank job) a few MB.
MAX_VALUE_BYTES = 32 << 20
FIRST_BATCH_BYTES = 64 << 10
MAX_BATCH_BYTES = 1 << 20
_EXACT_WINDOW = 64 << 10
# What reading a damaged or truncated file raises: igzip's BadGzipFile (an OSError), EOFError or IsalError.
READ_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, isal_zlib.error)

_CUT = re.compile(rb"\}[ \t\r\n]*([,\]])")
_NON_WS = re.compile(rb"[^ \t\r\n]")
_AT_INDEX = re.compile(r"`\$\[(\d+)\]")
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
# strict=False: control characters in strings are msgspec's call; this scanner only finds ends.
_SCANNER = json.JSONDecoder(strict=False)
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


class TraceParseError(ValueError):
    """The file is not a Chrome trace we can read; the message says where and why."""


def open_binary(path: Path) -> BinaryIO:
    """Open a trace for reading bytes, gunzipping when the file starts with the gzip magic."""
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        # ISA-L's gunzip: 3.5x the stdlib's speed (0.012 vs 0.041 s CPU for a 35 MB trace), the CRC check included.
        return igzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


class Buffer:
    """Bytes of one file read on demand; positions are buffer-relative, ``consumed`` makes them absolute."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self._stream = stream
        self.limit = limit
        self.buf = bytearray()
        self.pos = 0
        self.consumed = 0
        self.eof = False
        self.events = 0

    def offset(self, pos: int | None = None) -> int:
        return self.consumed + (self.pos if pos is None else pos)

    def read_more(self) -> bool:
        if self.eof:
            return False
        chunk = self._stream.read(CHUNK_BYTES)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def fill(self, end: int) -> None:
        while len(self.buf) < end and self.read_more():
            pass

    def compact(self) -> None:
        # Dropping the parsed front keeps the buffer at one batch plus a chunk.
        if self.pos >= CHUNK_BYTES:
            self.buf = self.buf[self.pos :]
            self.consumed += self.pos
            self.pos = 0

    def peek(self) -> int:
        """The next non-whitespace byte (without consuming it), or -1 at end of file."""
        while True:
            m = _NON_WS.search(self.buf, self.pos)
            if m is not None:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            self.compact()
            if not self.read_more():
                return -1

    def expect(self, char: bytes) -> None:
        got = self.peek()
        if got < 0:
            raise TraceParseError(f"the file ends at byte {self.offset()} where {char.decode()!r} should be: truncated")
        if got != char[0]:
            raise TraceParseError(f"expected {char.decode()!r} at byte {self.offset()}, found {chr(got)!r}")
        self.pos += 1

    def fail(self, exc: Exception, start: int, *, wrapped: bool = False, event: bool = False) -> TraceParseError:
        """A TraceParseError for a msgspec error in the text that began at ``start``.

        ``wrapped``: the text was a batch of events decoded inside ``[...]``;
        ``event``: it was one event. Both name the event by its index in the file.
        """
        if isinstance(exc, RecursionError):
            return TraceParseError(f"value nested too deep at byte {self.offset(start)}")
        shift = self.offset(start) - (1 if wrapped else 0)
        msg = _BYTE_POS.sub(lambda m: f"(byte {shift + int(m.group(1))})", str(exc))
        if wrapped:
            msg = _AT_INDEX.sub(lambda m: f"`event {self.events + int(m.group(1))}: $", msg)
        elif event:
            msg = msg.replace("`$", f"`event {self.events}: $")
        return TraceParseError(msg)

    def exact(self, decoders: tuple[msgspec.json.Decoder, ...], *, event: bool = False) -> list[Any]:
        """Decode the one JSON value at the current position (once per decoder), whatever its size up to the limit."""
        if self.peek() < 0:
            raise TraceParseError(f"the file ends at byte {self.offset()} where a value should be")
        start = self.pos
        window = _EXACT_WINDOW
        while True:
            self.fill(start + window + 1)
            whole = self.eof and len(self.buf) - start <= window
            part = bytes(self.buf[start : start + window])
            try:
                text = codecs.getincrementaldecoder("utf-8")().decode(part, final=whole)
                _, end = _SCANNER.raw_decode(text)
            except UnicodeDecodeError as exc:
                raise TraceParseError(f"not UTF-8 at byte {self.offset(start) + exc.start}") from None
            except RecursionError:
                raise TraceParseError(f"value nested too deep at byte {self.offset(start)}") from None
            except ValueError as exc:  # JSONDecodeError, or an integer past the stdlib's digit limit
                if not whole and window >= self.limit:
                    raise TraceParseError(
                        f"a value at byte {self.offset(start)} is over the {self.limit >> 20} MiB limit, or damaged"
                    ) from None
                if whole:
                    where = self.offset(start) + getattr(exc, "pos", 0)
                    raise TraceParseError(f"invalid JSON at byte {where}: {getattr(exc, 'msg', exc)}") from None
                window *= 2
                continue
            if end == len(text) and not whole:  # a number at the window's edge may go on
                window *= 2
                continue
            size = end if text.isascii() else len(text[:end].encode("utf-8"))
            text = bytes(self.buf[start : start + size])
            try:
                values = [decoder.decode(text) for decoder in decoders]
            except (msgspec.DecodeError, RecursionError) as exc:
                raise self.fail(exc, start, event=event) from None
            self.pos = start + size
            return values

    def batch(self, decoders: tuple[msgspec.json.Decoder, ...], target: int) -> tuple[list[list[Any]], int] | int | None:
        """Decode elements from here to a cut past ``target`` bytes.

        Returns ``(elements, separator byte)`` when the cut was an element
        boundary, the cut's distance when it was not, or None when no cut is
        in reach (the caller then reads one element exactly).
        """
        start = self.pos
        self.fill(start + target + 1)
        search_from = start + min(target, max(len(self.buf) - start - 1, 0))
        while True:
            m = _CUT.search(self.buf, search_from)
            if m is not None:
                break
            if len(self.buf) - start > self.limit:
                return None
            end = len(self.buf)
            if self.read_more():
                search_from = max(search_from, end - 64)
            elif search_from > start:
                # The file ends before the target: look for the last cut in halving steps.
                search_from = start + (search_from - start) // 2
            else:
                return None
        cut = m.start() + 1
        with memoryview(self.buf) as view, view[start:cut] as part:  # one copy; released before the buffer grows
            text = b"".join((b"[", part, b"]"))
        try:
            elements = [decoder.decode(text) for decoder in decoders]
        except msgspec.ValidationError as exc:  # the cut decoded, so the type error is real
            raise Refused(self.fail(exc, start, wrapped=True), text, str(exc)) from None
        except (msgspec.DecodeError, RecursionError):
            # A false cut, damage, or nesting too deep: shrink until the bad element is
            # read alone, so the elements before it are still yielded.
            return cut - start
        self.pos = m.end()
        return elements, self.buf[m.end() - 1]


class Refused(Exception):
    """A batch with a wrongly typed element: the error, the batch's text and msgspec's message."""

    def __init__(self, error: TraceParseError, text: bytes, message: str) -> None:
        super().__init__(str(error))
        self.error, self.text, self.message = error, text, message


def valid_prefix(text: bytes, decoders: tuple[msgspec.json.Decoder, ...], message: str) -> list[list[Any]]:
    """The elements of a JSON array ``text`` before the one a ValidationError ``message`` names."""
    m = _AT_INDEX.search(message)
    if m is None:
        return [[] for _ in decoders]
    try:
        raws = _RAWS.decode(text)[: int(m.group(1))]
    except (msgspec.DecodeError, RecursionError):
        return [[] for _ in decoders]
    return [[decoder.decode(raw) for raw in raws] for decoder in decoders]
