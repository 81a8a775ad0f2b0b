"""Cyclic garbage collection paused for one rank's work.

Reading a rank allocates millions of short-lived, acyclic objects (decoded
events and their dicts, spans); every 700 allocations CPython's collector
walks the young ones, and the older generations again and again as the rank's
spans pile up. Reference counting frees all of them anyway, so the walks buy
nothing: pausing them saved ~9% of the CPU time of analysing and merging the
8-rank 279 MB benchmark folder (the merge's dicts most).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused"]

P = ParamSpec("P")
R = TypeVar("R")


def gc_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with the cyclic collector off while it runs (restored after, also on an exception)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return run
