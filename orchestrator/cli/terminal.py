"""Text from traces, manifests and the service, made safe to print on a terminal.

Host names, reasons, op names and error details can come from anywhere: an
escape sequence in one could retitle, clear or rewrite the user's terminal,
and a bidirectional override could make it lie. Each is shown as a visible
``\\x1b``-style escape instead.
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_lines"]

# C0 and C1 controls, DEL, and the bidirectional marks, embeddings, overrides and isolates.
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE_IN_VALUE = re.compile(r"[\x00-\x1f\x7f-\x9f" + _BIDI + "]")
_UNSAFE_IN_LINES = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f" + _BIDI + "]")  # all but "\n"


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """``str(value)`` on one line, every control character escaped (newlines too)."""
    return _UNSAFE_IN_VALUE.sub(_escape, str(value))


def printable_lines(text: str) -> str:
    """``text`` with its line breaks kept and every other control character escaped."""
    return _UNSAFE_IN_LINES.sub(_escape, text)
