"""A device copy's direction and host memory kind, from the name the profiler gave it.

Kineto names CUDA's and HIP's copies ``Memcpy HtoD (Pageable -> Device)`` (PyTorch 1.8 wrote ``Memcpy HtoD`` alone),
and an Intel GPU's by PTI's kinds of memory at each end, ``Memcpy M2D (MEMORY(Unknown) -> DEVICE)``; MTIA's DMA names
no direction (``other``). Copies from or to pageable memory stage through a pinned buffer and block the host.
"""

from __future__ import annotations

import re
from typing import Literal

from orchestrator.traces.loader import Span

__all__ = ["CopyDirection", "CopyKind", "HostMemory", "copy_kind"]

CopyDirection = Literal["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other"]
HostMemory = Literal["pageable", "pinned"]
CopyKind = tuple[CopyDirection, HostMemory | None]

_COPY_NAME = re.compile(r"Memcpy (?P<dir>HtoD|DtoH|DtoD|HtoH|PtoP)\b(?: \((?P<src>\w+) -> (?P<dst>\w+)\))?")
# Kineto's XPU plugin names a copy by PTI's kinds of memory at each end: M is memory the runtime did not allocate
# (malloc'd: pageable), H the runtime's host allocation (pinned), D the device's, S shared (migrates on its own):
# "Memcpy M2D (MEMORY(Unknown) -> DEVICE)".
_XPU_COPY_NAME = re.compile(r"Memcpy (?P<src>[MHDS])2(?P<dst>[MHDS])\b")
_XPU_HOST_MEMORY: dict[str, HostMemory] = {"M": "pageable", "H": "pinned"}


def copy_kind(span: Span) -> CopyKind:
    """Direction and host memory kind of a device copy, from its name (``other`` and None where it names neither)."""
    m = _COPY_NAME.search(span.name)
    if m is None:
        return _xpu_copy_kind(span.name)
    direction: CopyDirection = m["dir"]  # type: ignore[assignment]
    host_side = m["src"] if direction == "HtoD" else m["dst"] if direction == "DtoH" else None
    memory: HostMemory | None = None
    if host_side in ("Pageable", "Pinned"):
        memory = "pageable" if host_side == "Pageable" else "pinned"
    return (direction, memory)


def _xpu_copy_kind(name: str) -> CopyKind:
    """An XPU copy's direction and host memory kind (``Memcpy D2M (DEVICE -> MEMORY(Unknown))``); anything to or from
    shared memory, which the driver migrates itself, is ``other``."""
    m = _XPU_COPY_NAME.search(name)
    if m is None or "S" in (m["src"], m["dst"]):
        return ("other", None)
    src, dst = (("D" if end == "D" else "H") for end in (m["src"], m["dst"]))
    direction: CopyDirection = f"{src}to{dst}"  # type: ignore[assignment]
    host_side = m["src"] if direction == "HtoD" else m["dst"] if direction == "DtoH" else None
    return (direction, _XPU_HOST_MEMORY.get(host_side or ""))
