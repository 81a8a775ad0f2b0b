"""A gzip file written from separately compressed pieces, without recompressing them.

A raw deflate stream ended by a sync flush stops on a byte boundary with no
final block, so such streams concatenate into one valid deflate stream; the
file's CRC-32 is combined from the pieces' CRCs. The merge compresses each
rank's events this way where the rank is processed (in parallel), and the
caller only copies bytes (a multi-member gzip would be simpler, but not every
trace viewer reads past the first member).
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from isal import isal_zlib

__all__ = ["COMPRESS_LEVEL", "Deflate", "GzipFile"]

# ISA-L's level 1 (of 0-3): as small as zlib's level 1 and ~4x faster (0.022 vs 0.081 s for a 35 MB trace),
# its CRC-32 ~7x faster than zlib's. The output is ordinary deflate: any gunzip reads it.
COMPRESS_LEVEL = 1
_ZEROS = bytes(1 << 20)


class Deflate:
    """A raw deflate stream ended by a sync flush, its CRC-32 and length: one piece of the gzip file."""

    def __init__(self) -> None:
        self._comp = isal_zlib.compressobj(COMPRESS_LEVEL, isal_zlib.DEFLATED, -15)
        self._chunks: list[bytes] = []
        self.crc = 0
        self.raw = 0

    def write(self, data: bytes | memoryview) -> None:
        self._chunks.append(self._comp.compress(data))
        self.crc = isal_zlib.crc32(data, self.crc)
        self.raw += len(data)

    def finish(self, mode: int = isal_zlib.Z_SYNC_FLUSH) -> bytes:
        self._chunks.append(self._comp.flush(mode))
        return b"".join(self._chunks)


def _crc_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from those of A and B: CRC-32 is affine, so shift A's over len(B) zero bytes."""
    a, z = crc1, 0
    while len2 > 0:
        n = min(len2, len(_ZEROS))
        a, z = isal_zlib.crc32(_ZEROS[:n], a), isal_zlib.crc32(_ZEROS[:n], z)
        len2 -= n
    return a ^ z ^ crc2


class GzipFile:
    """One gzip member written from deflate pieces that each end on a byte boundary."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._file.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # no name, no mtime, unknown OS
        self.crc = 0
        self.raw = 0

    def piece(self, data: bytes, crc: int, raw: int) -> None:
        self._file.write(data)
        self.crc = _crc_combine(self.crc, crc, raw)
        self.raw += raw

    def text(self, data: bytes, *, last: bool = False) -> None:
        d = Deflate()
        d.write(data)
        self.piece(d.finish(isal_zlib.Z_FINISH if last else isal_zlib.Z_SYNC_FLUSH), d.crc, d.raw)

    def close(self) -> None:
        self._file.write(struct.pack("<II", self.crc, self.raw & 0xFFFFFFFF))
        self._file.close()
